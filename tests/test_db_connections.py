"""A worker keeps its database connection between jobs with Django's default CONN_MAX_AGE (0),
and replaces it when a job leaves it broken or inside a transaction."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.backends.signals import connection_created
from django_scopes import scopes_disabled

from kumiko_jobs import dispatch
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.testing import drain
from project.demo.models import Note

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def opened() -> Any:
    events: list[object] = []

    def count(sender: Any, connection: Any, **kwargs: Any) -> None:
        events.append(connection)

    connection_created.connect(count)
    yield events
    connection_created.disconnect(count)


def test_default_conn_max_age_is_what_the_suite_runs_with() -> None:
    assert connection.settings_dict["CONN_MAX_AGE"] == 0


def test_connection_is_kept_between_jobs(opened: list[object], tenants: list[Any]) -> None:
    for n in range(30):
        dispatch("tests.record", {"n": n}, tenant=tenants[0])
    assert drain() == {"succeeded": 30}
    assert len(opened) <= 1  # at most the one this thread had not opened yet


def test_job_that_leaves_a_transaction_open_does_not_poison_the_next(
    opened: list[object], tenants: list[Any]
) -> None:
    bad = dispatch("tests.leaves_transaction_open", {}, tenant=tenants[0])
    good = dispatch("tests.notes", {}, tenant=tenants[0])
    assert drain() == {"succeeded": 2}
    assert not connection.in_atomic_block
    with scopes_disabled():
        assert not Note.objects.filter(text="left in an open transaction").exists()  # rolled back
    assert JobRun.objects.get(pk=bad.run_id).status == RunStatus.SUCCEEDED
    assert JobRun.objects.get(pk=good.run_id).status == RunStatus.SUCCEEDED
    assert len(opened) <= 2  # at most: a first connection, and its replacement


def test_job_that_breaks_the_connection_still_gets_its_record(tenants: list[Any]) -> None:
    broken = dispatch("tests.breaks_connection", {}, tenant=tenants[0])
    after = dispatch("tests.record", {}, tenant=tenants[0])
    assert drain() == {"succeeded": 2}
    assert JobRun.objects.get(pk=broken.run_id).status == RunStatus.SUCCEEDED
    assert JobRun.objects.get(pk=after.run_id).status == RunStatus.SUCCEEDED
