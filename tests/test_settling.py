"""When a success is written and said (outcomes.py, ``settle``): at once (drain, boot gates), or
by the worker's writer thread, which writes it before Redis hears of it and says it after."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connections

from kumiko_jobs import outcomes, records, run_rows, signals
from kumiko_jobs.attempt_records import write_outcomes
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.models import JobRun, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def _queued_run() -> JobMeta:
    meta = JobMeta(run_id=str(uuid.uuid4()), job_name="tests.record", lane="worker", tenant_id="7")
    job_id = f"settling-{meta.run_id}"
    row = run_rows.new_run_row(meta=meta, job_id=job_id, payload={}, queued_at=datetime.now(UTC))
    records.insert_queued([row])
    return meta


@pytest.fixture
def said() -> Iterator[list[str]]:
    """The run ids job_succeeded was sent for, in this process."""
    seen: list[str] = []

    def receiver(sender: str, run: signals.RunInfo, **extra: Any) -> None:
        seen.append(run.run_id)

    signals.job_succeeded.connect(receiver, weak=False)
    try:
        yield seen
    finally:
        signals.job_succeeded.disconnect(receiver)


def _status_elsewhere(run_id: str) -> str | None:
    """The run's status as another connection (another thread's) sees it."""
    found: list[str | None] = []

    def read() -> None:
        try:
            found.append(JobRun.objects.filter(pk=run_id).values_list("status", flat=True).first())
        finally:
            connections.close_all()

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    return found[0]


def test_settled_now_a_success_is_written_and_said_before_it_returns(said: list[str]) -> None:
    meta = _queued_run()
    outcome = outcomes.succeeded(None, "job", meta, [], None)
    assert outcome.settle is None
    assert said == [meta.run_id]
    assert JobRun.objects.get(pk=meta.run_id).status == RunStatus.SUCCEEDED


def test_a_success_for_the_writer_is_written_by_it_and_said_only_once_settled(said: list[str]) -> None:
    meta = _queued_run()
    outcome = outcomes.succeeded(None, "job", meta, [], None, settle="by_writer")
    assert outcome.update is not None and outcome.settle is not None
    assert (_status_elsewhere(meta.run_id), said) == (RunStatus.QUEUED, [])
    write_outcomes([outcome.update])
    assert (_status_elsewhere(meta.run_id), said) == (RunStatus.SUCCEEDED, [])
    outcome.settle()
    assert said == [meta.run_id]
