"""A --threads worker's successes, written by its writer thread several at a time
(success_writes.py, attempt_records.write_outcomes): in one round trip and one transaction on
PostgreSQL, one by one where that is not available or a batch fails; said once written."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection

from kumiko_jobs import attempt_records, dispatch, records, run_rows, signals
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.worker import LaneWorker

pytestmark = pytest.mark.django_db(transaction=True)


def _queued_run(run_id: str | None = None, *, row: bool = True) -> JobMeta:
    meta = JobMeta(run_id=run_id or str(uuid.uuid4()), job_name="tests.record", lane="worker", tenant_id="7")
    if row:
        new_row = run_rows.new_run_row(
            meta=meta, job_id=f"writes-{meta.run_id}", payload={}, queued_at=datetime.now(UTC)
        )
        records.insert_queued([new_row])
    return meta


def _success(meta: JobMeta, started: attempt_records.Started | None = None) -> attempt_records.OutcomeUpdate:
    return attempt_records.prepare_succeeded(
        meta=meta, now=datetime.now(UTC), logs=[{"message": "done"}], started=started
    )


def test_outcomes_are_written_together() -> None:
    runs = [_queued_run() for _ in range(3)]
    attempt_records.write_outcomes([_success(meta) for meta in runs])
    written = JobRun.objects.filter(pk__in=[meta.run_id for meta in runs])
    assert {(row.status, row.logs[-1]["message"]) for row in written} == {(RunStatus.SUCCEEDED, "done")}
    if connection.vendor == "postgresql":
        # One transaction: the three rows carry the same transaction id.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(DISTINCT xmin::text) FROM kumiko_jobs_jobrun WHERE id = ANY(%s)",
                [[uuid.UUID(meta.run_id) for meta in runs]],
            )
            assert cursor.fetchone() == (1,)


def test_a_batch_that_fails_is_written_one_by_one(caplog: pytest.LogCaptureFixture) -> None:
    good = [_queued_run(), _queued_run()]
    bad = _queued_run("not-a-run-id", row=False)
    with caplog.at_level(logging.WARNING, logger="kumiko_jobs"):
        attempt_records.write_outcomes([_success(good[0]), _success(bad), _success(good[1])])
    assert {row.status for row in JobRun.objects.all()} == {RunStatus.SUCCEEDED}
    assert JobRun.objects.count() == 2
    messages = [r.getMessage() for r in caplog.records]
    if connection.vendor == "postgresql":  # elsewhere each is written alone from the start
        assert "kumiko_jobs: writing 3 outcomes together failed; writing each alone" in messages
    assert any(m.startswith("kumiko_jobs: run record write mark_outcome failed") for m in messages), messages


def test_a_run_whose_row_has_not_landed_gets_it() -> None:
    meta = _queued_run(row=False)
    started = attempt_records.Started(
        job_id=f"writes-{meta.run_id}", payload={"n": 1}, worker="w", at=datetime.now(UTC)
    )
    attempt_records.write_outcomes([_success(meta, started)])
    row = JobRun.objects.get(pk=meta.run_id)
    assert (row.status, row.worker, row.payload) == (RunStatus.SUCCEEDED, "w", {"n": 1})


@pytest.fixture
def seen_at_signal() -> Iterator[list[tuple[str, str | None]]]:
    """(run id, its status as the receiver reads it) for each job_succeeded in this process."""
    seen: list[tuple[str, str | None]] = []

    def receiver(sender: str, run: signals.RunInfo, **extra: Any) -> None:
        status = JobRun.objects.filter(pk=run.run_id).values_list("status", flat=True).first()
        seen.append((run.run_id, status))

    signals.job_succeeded.connect(receiver, weak=False)
    try:
        yield seen
    finally:
        signals.job_succeeded.disconnect(receiver)


def test_a_threads_worker_says_each_success_once_after_its_record_is_written(
    tenants: list[Any], seen_at_signal: list[tuple[str, str | None]]
) -> None:
    runs = [dispatch("tests.record", {"n": n}, tenant=tenants[n % 3]) for n in range(30)]
    worker = LaneWorker("worker", threads=3)
    worker.work(burst=True, logging_level="WARNING")
    assert sorted(seen_at_signal) == sorted((str(r.run_id), RunStatus.SUCCEEDED) for r in runs)
