"""End to end: what a worker does with data it cannot run (garbage in Redis, a newer deploy's jobs)."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
import zlib
from typing import Any

import pytest
from django.utils import timezone

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys
from kumiko_jobs.dispatching import DispatchResult, submit
from kumiko_jobs.jobdata import JobMeta, encode_data
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.preparing import prepare
from kumiko_jobs.records import insert_queued
from kumiko_jobs.registry import registry
from kumiko_jobs.run_rows import new_run_row
from tests.integration.support import log_messages, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _push_raw(redis_client: Any, job_id: str, fields: dict[str, Any] | None) -> None:
    """What a buggy producer or a stock RQ tool could leave in the lane's RQ queue."""
    keys = get_keys()
    if fields is not None:
        stamp = "2026-01-01T00:00:00.000000Z"
        base = {
            "origin": keys.queue_name("worker"),
            "status": "queued",
            "created_at": stamp,
            "enqueued_at": stamp,
        }
        redis_client.hset(keys.job(job_id), mapping={**base, **fields})
    redis_client.rpush(keys.queue("worker"), job_id)


def test_malformed_jobs_fail_with_a_clear_error_and_the_worker_goes_on(
    start_worker: Any, wait_for_run: Any, traces: Any, redis_client: Any
) -> None:
    keys = get_keys()
    worker = start_worker("worker")
    tag = keys.id_tag
    meta = JobMeta(run_id=str(uuid.uuid4()), job_name="tests.record", lane="worker")
    insert_queued([new_run_row(meta=meta, job_id=f"{tag}-not-json", payload={}, queued_at=timezone.now())])
    foreign = zlib.compress(json.dumps(["os.system", None, ["tests.record", {"n": "rm -rf"}], {}]).encode())
    bad = {
        f"{tag}-not-json": {"data": b"\x80 this is not kumiko json", "meta": meta.to_json()},
        f"{tag}-foreign-call": {
            "data": foreign,
            "meta": meta.to_json().replace(meta.run_id, str(uuid.uuid4())),
        },
        f"{tag}-no-meta": {"data": encode_data("tests.record", {"n": "no meta"})},
    }
    for job_id, fields in bad.items():
        _push_raw(redis_client, job_id, fields)
    _push_raw(redis_client, f"{tag}-no-hash", None)  # the hash expired while the id waited
    valid = dispatch("tests.record", {"n": "valid"})

    assert wait_for_run(valid.run_id).status == RunStatus.SUCCEEDED
    failed = keys.failed("worker")
    wait_until(
        lambda: all(redis_client.zscore(failed, i) is not None for i in bad), 10, "malformed jobs failed"
    )

    [record] = traces("record")
    assert (record["payload"], record["pid"]) == ({"n": "valid"}, worker.pid)
    assert worker.proc.poll() is None
    output = worker.output()
    for job_id in bad:
        job = redis_client.hgetall(keys.job(job_id))
        assert job[b"status"] == b"failed"
        assert zlib.decompress(job[b"exc_info"]).startswith(b"Malformed job data, cannot run it")
        assert f"job_id={job_id}" in output
    assert "job data is not a kumiko job" in output
    assert "job data calls 'os.system', not a kumiko job" in output
    assert "job meta is not kumiko metadata" in output
    run = JobRun.objects.get(pk=meta.run_id)
    assert run.status == RunStatus.FAILED
    assert run.error.startswith("Malformed job data, cannot run it: job data is not a kumiko job")
    assert redis_client.zscore(failed, f"{tag}-no-hash") is None


def _dispatch_unknown_job() -> DispatchResult:
    """Queue a job the running deploy does not know, as a newer deploy's web process would."""
    future = dataclasses.replace(registry.get("tests.record"), name="tests.from_the_future")
    prepared = prepare(future, {"n": "new"}, tenant_id=None, user_id=None)
    submit([prepared])
    return DispatchResult(future.name, "queued", prepared.job_id, str(prepared.row.id))


def test_unknown_job_waits_for_a_deploy_that_knows_it(
    start_worker: Any, wait_for_run: Any, traces: Any, redis_client: Any
) -> None:
    worker = start_worker("worker")
    unknown = _dispatch_unknown_job()

    def seen() -> JobRun | None:
        run = JobRun.objects.get(pk=unknown.run_id)
        return run if any("Unknown job" in msg for msg in log_messages(run)) else None

    run = wait_until(seen, 10, "the unknown job to be seen")
    assert (run.status, run.attempt, run.error) == (RunStatus.QUEUED, 1, "")
    [warning] = log_messages(run, "warning")
    assert warning.startswith("Unknown job 'tests.from_the_future' on worker of this deploy; retrying in 15s")
    # The record is written before Redis is told (outcomes.py), so the retry may land a moment later.
    retry_at = wait_until(
        lambda: redis_client.zscore(get_keys().scheduled("worker"), unknown.job_id), 5, "the retry in Redis"
    )
    assert 5 < retry_at - time.time() <= 15
    assert "Unknown job 'tests.from_the_future'" in worker.output()

    after = dispatch("tests.record", {"n": "known"})
    assert wait_for_run(after.run_id).status == RunStatus.SUCCEEDED
    assert [e["payload"] for e in traces("record")] == [{"n": "known"}]
    assert JobRun.objects.get(pk=unknown.run_id).status == RunStatus.QUEUED


def test_unknown_job_fails_once_its_grace_period_is_over(
    start_worker: Any, wait_for_run: Any, traces: Any, redis_client: Any
) -> None:
    start_worker(
        "worker", env={"KUMIKO_TEST_UNKNOWN_JOB_GRACE": "1", "KUMIKO_TEST_UNKNOWN_JOB_RETRY_DELAY": "0.2"}
    )
    unknown = _dispatch_unknown_job()

    run = wait_for_run(unknown.run_id, timeout=15)

    assert (run.status, run.attempt) == (RunStatus.FAILED, 1)
    assert run.error.startswith("UnknownJob: Unknown job 'tests.from_the_future'.")
    assert len(log_messages(run, "warning")) >= 1
    assert len(log_messages(run, "error")) == 1
    assert run.finished_at is not None and (run.finished_at - run.queued_at).total_seconds() >= 1
    keys = get_keys()
    assert redis_client.zscore(keys.failed("worker"), unknown.job_id) is not None
    assert redis_client.zscore(keys.scheduled("worker"), unknown.job_id) is None
    assert traces() == []
