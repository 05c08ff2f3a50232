"""An attempt's record writes are conditional (attempt_records.py): a worker that stalled past its
lease, after the reaper retried or failed its run, must not write its outcome over the newer
state, and the reaper must not write a retry over a success that landed after it read the
record. An operator's requeue, which marks the row queued after its push, must still let the
worker that took the run first record it."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kumiko_jobs import attempt_records, dispatch, outcomes, put_back, records, signals
from kumiko_jobs.attempt_records import Started, prepare_succeeded, write_outcomes
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.execution import run_claimed
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.lane import Claim, Finished, finish_and_claim
from kumiko_jobs.leases import reap
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.registry import registry
from kumiko_jobs.requeueing import requeue_jobs
from kumiko_jobs.run_marker import mark_running
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def stalled_claim() -> Any:
    """A worker claims a job and stalls: its lease has already run out."""
    job = finish_and_claim(get_redis(), get_keys(), "worker", claim=Claim("stalled", "x", time.time() - 1))
    assert job is not None
    return job


@pytest.fixture
def said() -> Any:
    """Every job_started, job_succeeded and job_failed sent, as (signal, attempt)."""
    heard: list[tuple[str, int]] = []
    receivers = {}
    for name in ("job_started", "job_succeeded", "job_failed"):

        def receiver(sender: Any, run: Any, name: str = name, **kwargs: Any) -> None:
            heard.append((name, run.attempt))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver)
    yield heard
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def test_a_stalled_worker_leaves_the_retry_that_succeeded_alone(said: Any, traces: Any) -> None:
    result = dispatch("tests.record", {"n": 1})
    job = stalled_claim()
    assert reap(get_redis(), get_keys(), "worker", "reaper") == 1  # retried: attempt 2
    assert drain() == {"succeeded": 1}
    said.clear()
    # The stalled worker wakes up, finishes its handler and reports attempt 1.
    outcome = run_claimed(job, worker="stalled", consumer_lane="worker")
    assert outcome.kind == "stale"
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.attempt, run.worker) == (RunStatus.SUCCEEDED, 2, "kumiko-drain")
    assert said == []  # neither job_started nor job_succeeded for the stale attempt
    assert len(traces("record")) == 2  # it did run twice: at least once, as promised


def test_a_stalled_worker_does_not_fail_a_run_that_succeeded_since(said: Any) -> None:
    result = dispatch("tests.record", {"n": 1})
    job = stalled_claim()
    meta = JobMeta.from_json(job.meta_raw)
    started_at = datetime.now(UTC)
    reap(get_redis(), get_keys(), "worker", "reaper")
    drain()
    said.clear()
    start = Started(job_id=job.job_id, payload={"n": 1}, worker="stalled", at=started_at)
    outcome = outcomes.failed_attempt(
        registry.get("tests.record"), job.job_id, meta, RuntimeError("late"), [], start=start
    )
    assert outcome.kind == "stale"
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.attempt, run.error) == (RunStatus.SUCCEEDED, 2, "")
    assert said == []


def test_a_stalled_worker_does_not_succeed_a_run_the_reaper_failed(said: Any, settings: Any) -> None:
    """With no attempt left, the reaper fails the run finally at the same attempt number: only
    the record's finish after the attempt's start tells the stale write apart."""
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "ABANDONED_RETRIES": 0}
    result = dispatch("tests.hang_first", {})  # retries=0
    job = stalled_claim()
    meta = JobMeta.from_json(job.meta_raw)
    start = Started(job_id=job.job_id, payload={}, worker="stalled", at=datetime.now(UTC))
    assert reap(get_redis(), get_keys(), "worker", "reaper") == 1
    failed = JobRun.objects.get(pk=result.run_id)
    assert (failed.status, failed.attempt) == (RunStatus.FAILED, 1)
    said.clear()
    outcome = outcomes.succeeded(registry.get("tests.hang_first"), job.job_id, meta, [], start)
    assert outcome.kind == "stale"
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.error) == (RunStatus.FAILED, failed.error)
    assert said == []


def test_the_writer_leaves_out_a_stale_success_and_writes_the_others() -> None:
    stale_run, fresh_run = dispatch("tests.record", {"n": 1}), dispatch("tests.record", {"n": 2})
    stale_job = stalled_claim()
    fresh_job = finish_and_claim(get_redis(), get_keys(), "worker", claim=Claim("w", "y", time.time() + 60))
    assert fresh_job is not None
    now = datetime.now(UTC)
    stale_meta, fresh_meta = (JobMeta.from_json(j.meta_raw) for j in (stale_job, fresh_job))
    # The stalled worker's run was failed by the reaper meanwhile (finished after its start).
    JobRun.objects.filter(pk=stale_run.run_id).update(
        status=RunStatus.FAILED, finished_at=now + timedelta(seconds=5), error="AbandonedJob"
    )
    updates = [
        prepare_succeeded(
            meta=m, now=now, logs=[], started=Started(job_id=j.job_id, payload={}, worker="w", at=now)
        )
        for m, j in ((stale_meta, stale_job), (fresh_meta, fresh_job))
    ]
    from kumiko_jobs import task_execution

    task_execution._running[str(stale_run.run_id)] = object()  # type: ignore[assignment]
    assert write_outcomes(updates) == {0}
    assert str(stale_run.run_id) not in task_execution._running  # a task's attempt is forgotten
    assert JobRun.objects.get(pk=stale_run.run_id).status == RunStatus.FAILED
    assert JobRun.objects.get(pk=fresh_run.run_id).status == RunStatus.SUCCEEDED


def test_a_stale_attempt_is_not_marked_running(said: Any) -> None:
    result = dispatch("tests.record", {"n": 1})
    job = stalled_claim()
    meta = JobMeta.from_json(job.meta_raw)
    start = Started(job_id=job.job_id, payload={"n": 1}, worker="stalled", at=datetime.now(UTC))
    reap(get_redis(), get_keys(), "worker", "reaper")
    said.clear()
    assert mark_running(meta, start) is False
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.attempt) == (RunStatus.QUEUED, 2)
    assert said == []


def test_the_reaper_does_not_retry_a_success_written_after_it_read_the_record(
    monkeypatch: pytest.MonkeyPatch, traces: Any
) -> None:
    """The worker stalled, not died: its success lands between the reaper's read of the record
    and the reaper's write. The reaper then tells Redis the success instead of a retry."""
    result = dispatch("tests.record", {"n": 1})
    job = stalled_claim()
    meta = JobMeta.from_json(job.meta_raw)
    start = Started(job_id=job.job_id, payload={"n": 1}, worker="stalled", at=datetime.now(UTC))
    real_status_of = records.status_of
    reads: list[str | None] = []

    def status_then_success(run_id: str) -> str | None:
        status = real_status_of(run_id)
        reads.append(status)
        if len(reads) == 1:  # the worker's write lands right after the reaper's first read
            assert outcomes.succeeded(registry.get("tests.record"), job.job_id, meta, [], start).kind == "ok"
        return status

    monkeypatch.setattr(records, "status_of", status_then_success)
    assert reap(get_redis(), get_keys(), "worker", "reaper") == 1
    assert reads[0] == RunStatus.QUEUED and RunStatus.SUCCEEDED in reads[1:]
    monkeypatch.undo()
    assert drain() == {}  # not queued again
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.attempt, run.error) == (RunStatus.SUCCEEDED, 1, "")
    assert not get_redis().exists(get_keys().job(job.job_id))  # told Redis: succeeded (RESULT_TTL 0)


def test_a_requeued_run_taken_before_its_row_is_marked_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator's requeue pushes first and marks the row queued after: a worker may run the
    job in between, while the row still says failed (finished before the attempt started)."""
    result = dispatch("tests.unrecoverable", {})
    assert drain() == {"failed": 1}
    first_end = JobRun.objects.get(pk=result.run_id).finished_at
    marks: list[Any] = []
    monkeypatch.setattr(records, "mark_requeued_by_operator", lambda *a, **k: marks.append((a, k)))
    assert requeue_jobs([result.job_id]).requeued == (result.job_id,)
    assert drain() == {"failed": 1}  # taken and run before the row is marked
    run = JobRun.objects.get(pk=result.run_id)
    assert run.status == RunStatus.FAILED and run.finished_at > first_end
    ((args, kwargs),) = marks
    monkeypatch.undo()
    records.mark_requeued_by_operator(*args, **kwargs)  # the requeue's own write, late
    assert JobRun.objects.get(pk=result.run_id).finished_at == run.finished_at  # kept


def test_a_short_run_of_a_requeued_run_is_recorded_before_its_row_is_marked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same race where a short run's start is written with its outcome (no "running" write
    before it, as in a runjobs worker): the outcome's write carries the attempt's start."""
    result = dispatch("tests.unrecoverable", {})
    assert drain() == {"failed": 1}
    monkeypatch.setattr(records, "mark_requeued_by_operator", lambda *a, **k: None)
    assert requeue_jobs([result.job_id]).requeued == (result.job_id,)
    job = finish_and_claim(get_redis(), get_keys(), "worker", claim=Claim("w", "z", time.time() + 60))
    assert job is not None and job.job_id == result.job_id
    meta = JobMeta.from_json(job.meta_raw)
    start = Started(job_id=job.job_id, payload={}, worker="w", at=datetime.now(UTC))
    outcome = outcomes.succeeded(registry.get("tests.unrecoverable"), job.job_id, meta, [], start)
    assert outcome.kind == "ok"
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.worker) == (RunStatus.SUCCEEDED, "w")


def test_a_guarded_write_still_creates_a_missing_row() -> None:
    """The dispatcher's INSERT may not have landed when a fast worker ends the run."""
    result = dispatch("tests.record", {"n": 1})
    job = finish_and_claim(get_redis(), get_keys(), "worker", claim=Claim("w", "z", time.time() + 60))
    assert job is not None
    JobRun.objects.filter(pk=result.run_id).delete()
    meta = JobMeta.from_json(job.meta_raw)
    start = Started(job_id=job.job_id, payload={"n": 1}, worker="w", at=datetime.now(UTC))
    outcome = outcomes.succeeded(registry.get("tests.record"), job.job_id, meta, [], start)
    assert outcome.kind == "ok"
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.worker, run.attempt) == (RunStatus.SUCCEEDED, "w", 1)


def test_a_stale_requeue_is_not_recorded(said: Any) -> None:
    """The writes that put a run back without an attempt (an unknown job during a deploy, a
    lowered cap) are guarded too."""
    result = dispatch("tests.record", {"n": 1})
    job = stalled_claim()
    meta = JobMeta.from_json(job.meta_raw)
    start = Started(job_id=job.job_id, payload={"n": 1}, worker="stalled", at=datetime.now(UTC))
    reap(get_redis(), get_keys(), "worker", "reaper")
    assert drain() == {"succeeded": 1}
    assert put_back.unknown_job(meta, "tests.gone", start).kind == "stale"
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.next_attempt_at) == (RunStatus.SUCCEEDED, None)


def test_redis_hears_nothing_of_a_stale_attempt() -> None:
    """A stale attempt's lease stays where it is (with the reaper, if it still holds the run)."""
    dispatch("tests.record", {"n": 1})
    job = finish_and_claim(get_redis(), get_keys(), "worker", claim=Claim("w", "s", time.time() + 60))
    assert job is not None
    member = f"{job.job_id}:s"
    finish_and_claim(
        get_redis(), get_keys(), "worker", Finished(job.job_id, member, outcomes.Outcome("stale", "stale"))
    )
    assert get_redis().zscore(get_keys().started("worker"), member) is not None
    assert get_redis().hget(get_keys().job(job.job_id), "status") == b"started"


def _started_by_a_worker() -> tuple[Any, JobMeta, Started]:
    """A run of tests.record claimed by worker "w" and started now: its dispatch, meta, start."""
    result = dispatch("tests.record", {"n": 1})
    job = finish_and_claim(get_redis(), get_keys(), "worker", claim=Claim("w", "z", time.time() + 60))
    assert job is not None
    start = Started(job_id=job.job_id, payload={"n": 1}, worker="w", at=datetime.now(UTC))
    return result, JobMeta.from_json(job.meta_raw), start


def test_a_write_sent_again_after_its_answer_was_lost_counts_as_written(said: Any) -> None:
    """The first try committed and the connection dropped before its answer: guarded_writes
    sends it again, and the guard then finds the row moved on by that same write."""
    result, meta, start = _started_by_a_worker()
    now = start.at
    update = prepare_succeeded(meta=meta, now=now, logs=[], started=start)
    update.mark_outcome()
    update.mark_outcome()  # the same write, sent again: no StaleAttempt
    assert write_outcomes([update]) == set()
    assert JobRun.objects.get(pk=result.run_id).status == RunStatus.SUCCEEDED


@pytest.mark.parametrize("write", ["deferred", "requeued", "retry"])
def test_a_write_sent_again_after_its_answer_was_lost_keeps_its_log_lines_once(write: str) -> None:
    """A deferral or a requeue leaves the run unfinished at the same attempt, so its write sent
    again passes the guard a second time: it must not append the attempt's lines again. (A
    retry moves the run to the next attempt, so its resend is refused by the guard: the case
    shows the same end state, by the older path.)"""
    result, meta, start = _started_by_a_worker()
    now = start.at
    line = {"t": now.isoformat(), "level": "info", "msg": f"{write} once", "attempt": 1}
    later = now + timedelta(seconds=5)
    for _ in range(2):  # the first try committed, its answer was lost, and it is sent again
        if write == "deferred":
            attempt_records.mark_deferred(meta=meta, now=now, next_at=later, logs=[line], started=start)
        elif write == "requeued":
            attempt_records.mark_requeued(meta=meta, now=now, next_at=later, logs=[line], started=start)
        else:
            attempt_records.mark_retry(
                meta=meta, now=now, next_at=later, error="E", traceback="", logs=[line],
                next_attempt=2, max_attempts=3, started=start,
            )  # fmt: skip
    run = JobRun.objects.get(pk=result.run_id)
    assert [entry["msg"] for entry in run.logs] == [f"{write} once"]


def test_an_unknown_job_past_its_grace_is_failed_with_its_start(settings: Any) -> None:
    """Failed at once by a worker that does not know the job (a requeued run, whose row still
    says failed until the requeue marks it): the write carries the attempt's start."""
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "UNKNOWN_JOB_GRACE": 0}
    result = dispatch("tests.unrecoverable", {})
    assert drain() == {"failed": 1}
    job = finish_and_claim(get_redis(), get_keys(), "worker", claim=Claim("w", "z", time.time() + 60))
    assert job is None  # failed: nothing waits
    JobRun.objects.filter(pk=result.run_id).update(finished_at=datetime.now(UTC) - timedelta(minutes=1))
    meta = JobMeta.from_json(get_redis().hget(get_keys().job(result.job_id), "meta"))
    start = Started(job_id=result.job_id, payload={}, worker="w", at=datetime.now(UTC))
    outcome = put_back.unknown_job(meta, "tests.gone", start)
    assert outcome.kind == "failed"
    assert "Unknown job" in JobRun.objects.get(pk=result.run_id).error


def test_a_stale_task_attempt_leaves_no_running_result_behind() -> None:
    from kumiko_jobs import task_execution
    from kumiko_jobs.exceptions import StaleAttempt

    task_execution._running["some-run"] = object()  # type: ignore[assignment]
    assert outcomes.stale(StaleAttempt("some-run", 1, "succeeded")).kind == "stale"
    assert "some-run" not in task_execution._running
