"""A success left settling (outcomes.py): its UPDATE is in PostgreSQL before the worker tells
Redis, it is said (signals) only once settled, and a write that fails under it is written again.
Real PostgreSQL for the pipelined parts; the fallback runs on any database."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

from kumiko_jobs import outcomes, records, run_rows, signals
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.models import JobRun, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)
postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="a write left in flight needs libpq's pipeline (PostgreSQL)"
)


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


@postgresql_only
def test_a_settling_success_is_written_before_it_settles_and_said_only_once_settled(said: list[str]) -> None:
    meta = _queued_run()
    outcome = outcomes.succeeded(None, "job", meta, [], None, settle="after_step")
    assert outcome.kind == "ok" and outcome.settle is not None
    # Sent, not waited for: the answer is still unread on this connection (libpq's pipeline).
    assert connection.connection.pgconn.pipeline_status
    # PostgreSQL runs it meanwhile, as the worker's lane step does its round trip.
    deadline = time.monotonic() + 5
    while _status_elsewhere(meta.run_id) != RunStatus.SUCCEEDED:
        assert time.monotonic() < deadline, "the success's UPDATE never reached PostgreSQL"
        time.sleep(0.01)
    assert said == []
    outcome.settle()
    assert said == [meta.run_id]
    assert not connection.connection.pgconn.pipeline_status
    assert JobRun.objects.get(pk=meta.run_id).status == RunStatus.SUCCEEDED  # the connection works on


@postgresql_only
def test_a_settling_write_that_dies_under_its_connection_is_written_again_on_a_fresh_one(
    said: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    meta = _queued_run()
    pid = connection.connection.info.backend_pid
    locked, sent, done = threading.Event(), threading.Event(), threading.Event()

    def hold_the_row_then_kill_the_writer() -> None:
        # Another session locks the row, so the UPDATE waits in PostgreSQL; then the writer's
        # backend is terminated under it, and the lock let go.
        try:
            with transaction.atomic():
                JobRun.objects.select_for_update().get(pk=meta.run_id)
                locked.set()
                sent.wait(5)
                with connection.cursor() as cursor:
                    for _ in range(500):
                        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
                        if cursor.fetchone() == ("Lock",):
                            break
                        time.sleep(0.01)
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        finally:
            connections.close_all()
            done.set()

    thread = threading.Thread(target=hold_the_row_then_kill_the_writer)
    thread.start()
    assert locked.wait(5)
    outcome = outcomes.succeeded(None, "job", meta, [], None, settle="after_step")
    sent.set()
    assert done.wait(10)
    thread.join()
    assert outcome.settle is not None
    outcome.settle()
    assert "run record write start_succeeded failed; writing it again" in caplog.text
    assert said == [meta.run_id]
    assert JobRun.objects.get(pk=meta.run_id).status == RunStatus.SUCCEEDED


def test_settled_now_a_success_is_written_and_said_before_it_returns(said: list[str]) -> None:
    meta = _queued_run()
    outcome = outcomes.succeeded(None, "job", meta, [], None)
    assert outcome.settle is None
    assert said == [meta.run_id]
    assert JobRun.objects.get(pk=meta.run_id).status == RunStatus.SUCCEEDED


def test_where_the_pipeline_cannot_take_it_the_write_is_done_at_once_and_only_the_saying_waits(
    said: list[str],
) -> None:
    meta = _queued_run()
    with override_settings(KUMIKO_JOBS={"PIPELINED_WRITES": False}):
        outcome = outcomes.succeeded(None, "job", meta, [], None, settle="after_step")
        assert _status_elsewhere(meta.run_id) == RunStatus.SUCCEEDED
        assert said == []
        assert outcome.settle is not None
        outcome.settle()
    assert said == [meta.run_id]


@postgresql_only
def test_a_settling_write_that_cannot_be_sent_is_written_at_once_on_a_fresh_connection(
    said: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    meta = _queued_run()
    connection.connection.close()  # as a job that closed the socket under Django's feet
    outcome = outcomes.succeeded(None, "job", meta, [], None, settle="after_step")
    assert "sending run record write start_succeeded failed; writing it again" in caplog.text
    assert _status_elsewhere(meta.run_id) == RunStatus.SUCCEEDED  # before it settles
    assert said == []
    assert outcome.settle is not None
    outcome.settle()
    assert said == [meta.run_id]
