"""Run record writes (records.py): one row per run, whatever the race, and never a dead worker."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection, transaction

from kumiko_jobs import attempt_records, guarded_writes, records
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.preparing import prepare
from kumiko_jobs.registry import registry

pytestmark = pytest.mark.django_db(transaction=True)


def _prepared() -> Any:
    return prepare(registry.get("tests.record"), {}, tenant_id=None, user_id=None)


def meta_of(prepared: Any) -> JobMeta:
    raw = dict(zip(prepared.fields[::2], prepared.fields[1::2], strict=True))["meta"]
    return JobMeta.from_json(raw)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a second connection racing needs PostgreSQL")
def test_a_worker_recording_a_start_while_the_dispatchers_insert_commits_writes_one_row() -> None:
    prepared = _prepared()
    inserted, release = threading.Event(), threading.Event()

    def dispatcher() -> None:
        with transaction.atomic():
            records.insert_queued([prepared.row])
            inserted.set()
            release.wait(5)  # holds the uncommitted row while the worker writes
        connection.close()

    thread = threading.Thread(target=dispatcher)
    thread.start()
    assert inserted.wait(5)
    threading.Timer(0.3, release.set).start()
    now = datetime.now(UTC)
    attempt_records.mark_running(
        meta=meta_of(prepared), job_id=prepared.job_id, payload={}, worker="w1", now=now
    )
    thread.join()
    run = JobRun.objects.get(job_id=prepared.job_id)
    assert (run.status, run.worker, run.started_at) == (RunStatus.RUNNING, "w1", now)


def test_an_outcome_for_a_run_without_a_row_creates_it_once() -> None:
    prepared = _prepared()
    meta = meta_of(prepared)
    start = attempt_records.Started(job_id=prepared.job_id, payload={}, worker="w1", at=datetime.now(UTC))
    attempt_records.mark_succeeded(meta=meta, now=datetime.now(UTC), logs=[{"msg": "done"}], started=start)
    records.insert_queued([prepared.row])  # the dispatcher's insert, late: changes nothing
    [run] = JobRun.objects.filter(job_id=prepared.job_id)
    assert (run.status, run.worker, run.logs) == (RunStatus.SUCCEEDED, "w1", [{"msg": "done"}])


def test_a_dispatchers_late_insert_gives_a_row_a_worker_created_its_queue_time() -> None:
    """A fast worker (another process) took the run before the dispatcher's INSERT and created
    the row with its start as the queue time; the late INSERT finds it and sets the queue time
    the run has (a Django task's enqueued_at read back must be enqueue()'s)."""
    from datetime import timedelta

    from kumiko_jobs import run_rows

    prepared = _prepared()
    meta = meta_of(prepared)
    later = prepared.row.queued_at + timedelta(milliseconds=5)
    start = attempt_records.Started(job_id=prepared.job_id, payload={}, worker="w1", at=later)
    attempt_records.mark_succeeded(meta=meta, now=later, logs=[], started=start)
    assert JobRun.objects.get(pk=prepared.row.id).queued_at == later
    sent = records.start_insert_queued(prepared.row)  # the dispatcher's insert, late
    if sent is None:
        records.insert_queued([prepared.row], after_push=True)  # not PostgreSQL's pipeline: the usual insert
    else:
        assert sent()
    run = JobRun.objects.get(pk=prepared.row.id)
    assert (run.queued_at, run.status, run.started_at) == (prepared.row.queued_at, RunStatus.SUCCEEDED, later)
    # Pipelined (PostgreSQL) or not, and never forward: a worker's own late insert moves nothing.
    again = run_rows.new_run_row(
        meta=meta, job_id=prepared.job_id, payload={}, queued_at=later + timedelta(1)
    )
    records.insert_queued([again])
    assert JobRun.objects.get(pk=prepared.row.id).queued_at == prepared.row.queued_at


def test_safe_never_raises_and_says_whether_the_write_happened(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise ValueError("badly formed value")

    assert guarded_writes.safe(broken) is False
    assert "run record write broken failed" in caplog.text
    assert guarded_writes.safe(records.mark_pushed, [], now=datetime.now(UTC)) is True


def test_a_refused_late_push_leaves_a_run_that_ran_meanwhile_alone() -> None:
    """The outbox or repair pushes a row again; a gate refuses it because the run was pushed
    and ran meanwhile: its outcome must stay, not become "dropped"."""
    from kumiko_jobs import dispatch
    from kumiko_jobs.testing import drain

    ran = dispatch("tests.record", {"n": 1})
    waiting = dispatch("tests.record", {"n": 2}, delay=60)
    assert drain(timeout=0) == {"succeeded": 1}
    now = datetime.now(UTC)
    for result in (ran, waiting):
        records.mark_not_enqueued(result.run_id, now=now, reason="max_per_tenant")
    assert JobRun.objects.get(pk=ran.run_id).status == RunStatus.SUCCEEDED
    assert JobRun.objects.get(pk=waiting.run_id).status == RunStatus.DROPPED  # still queued: dropped
