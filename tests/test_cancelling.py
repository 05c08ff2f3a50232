"""cancel_queued() and requeue_jobs(): operators' writes that keep flows, limits and rows right."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from kumiko_jobs import dispatch
from kumiko_jobs.cancelling import CANCELED_TTL, cancel_queued
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.repair import repair_stale_runs
from kumiko_jobs.requeueing import requeue_jobs
from kumiko_jobs.testing import drain
from tests.test_gates import Lane

pytestmark = pytest.mark.django_db(transaction=True)


def active(redis_client: Any, key: str) -> int:
    return int(redis_client.hget(get_keys().active, key) or 0)


def test_cancel_queued_and_scheduled_runs_releases_their_limits_once(
    redis_client: Any, tenants: list[Any]
) -> None:
    tenant = str(tenants[0].pk)
    key = f"m|tests.limited|{tenant}"
    queued = dispatch("tests.limited", {}, tenant=tenant)
    later = dispatch("tests.limited", {}, tenant=tenant, delay=3600)
    assert active(redis_client, key) == 2

    result = cancel_queued([queued.job_id, later.job_id, queued.job_id])
    assert result.canceled == (queued.job_id, later.job_id) and result.refused == {}
    assert active(redis_client, key) == 0
    keys = get_keys()
    assert redis_client.llen(keys.flow("worker", f"t|{tenant}")) == 0
    assert redis_client.zscore(keys.scheduled("worker"), later.job_id) is None
    for job_id in (queued.job_id, later.job_id):
        assert redis_client.hget(keys.job(job_id), "status") == b"canceled"
        assert 0 < redis_client.ttl(keys.job(job_id)) <= CANCELED_TTL
    assert set(JobRun.objects.values_list("status", flat=True)) == {RunStatus.DROPPED}

    again = cancel_queued([queued.job_id])
    assert again.canceled == () and again.refused == {queued.job_id: "already canceled"}
    assert active(redis_client, key) == 0
    assert drain() == {}


def test_a_claimed_run_is_refused_and_its_worker_releases_it(redis_client: Any, tenants: list[Any]) -> None:
    tenant = str(tenants[0].pk)
    result = dispatch("tests.limited", {}, tenant=tenant)
    lane = Lane()
    claimed = lane.claim()
    assert claimed is not None
    assert cancel_queued([result.job_id]).refused == {result.job_id: "running: a worker has it"}
    assert active(redis_client, f"m|tests.limited|{tenant}") == 1
    lane.finish(claimed)
    assert active(redis_client, f"m|tests.limited|{tenant}") == 0


def test_a_deferred_run_is_dropped(redis_client: Any) -> None:
    result = dispatch("tests.defer", {"times": 1, "ms": 60_000})
    assert drain(timeout=0.5) == {"deferred": 1}
    assert JobRun.objects.get(pk=result.run_id).status == RunStatus.DEFERRED
    assert cancel_queued([result.job_id]).canceled == (result.job_id,)
    assert JobRun.objects.get(pk=result.run_id).status == RunStatus.DROPPED


def test_cancelling_the_rest_of_a_parked_flow_forgets_it(redis_client: Any, tenants: list[Any]) -> None:
    tenant = str(tenants[0].pk)
    runs = [dispatch("tests.capped", {}, tenant=tenant) for _ in range(3)]  # cap 2
    lane = Lane()
    first, second = lane.claim(), lane.claim()
    assert first is not None and second is not None
    flow = f"c2|tests.capped|{tenant}"
    states = get_keys().lane("worker") + "st"
    assert redis_client.hget(states, flow) == b"p"
    assert cancel_queued([runs[2].job_id]).canceled == (runs[2].job_id,)
    assert not redis_client.hexists(states, flow)
    lane.finish(first)
    lane.finish(second)
    assert not redis_client.exists(get_keys().ring("worker"))
    nxt = dispatch("tests.capped", {}, tenant=tenant)
    assert (claimed := lane.claim()) is not None and claimed.job_id == nxt.job_id


def test_repair_drops_a_canceled_run_whose_row_write_was_lost(redis_client: Any, tenants: list[Any]) -> None:
    tenant = str(tenants[0].pk)
    result = dispatch("tests.limited", {}, tenant=tenant)
    cancel_queued([result.job_id])
    # As if the process died between Redis and the database: the row still says queued.
    JobRun.objects.filter(pk=result.run_id).update(
        status=RunStatus.QUEUED, updated_at=timezone.now() - timedelta(hours=1)
    )
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 1
    assert JobRun.objects.get(pk=result.run_id).status == RunStatus.DROPPED
    assert active(redis_client, f"m|tests.limited|{tenant}") == 0  # not released twice (-1)
    assert not redis_client.hexists(get_keys().active, f"m|tests.limited|{tenant}")


def test_jobs_of_another_prefix_or_unknown_are_refused(redis_client: Any) -> None:
    redis_client.hset("rq:job:stranger-1", mapping={"status": "queued", "origin": "elsewhere:worker"})
    try:
        result = cancel_queued(["stranger-1", "nope"])
        assert result.refused == {
            "stranger-1": "not a kumiko_jobs job of this project's lanes",
            "nope": "no such job",
        }
        assert redis_client.hget("rq:job:stranger-1", "status") == b"queued"
    finally:
        redis_client.delete("rq:job:stranger-1")


def test_requeue_a_failed_run_puts_it_back_in_its_flow(redis_client: Any, traces: Any) -> None:
    result = dispatch("tests.unrecoverable", {})
    assert drain() == {"failed": 1}
    keys = get_keys()
    assert redis_client.zscore(keys.failed("worker"), result.job_id) is not None
    assert requeue_jobs([result.job_id]).requeued == (result.job_id,)
    assert redis_client.zscore(keys.failed("worker"), result.job_id) is None
    assert redis_client.ttl(keys.job(result.job_id)) == -1  # no longer expiring as a failure
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.finished_at) == (RunStatus.QUEUED, None)
    assert drain() == {"failed": 1}
    assert len(traces("unrecoverable")) == 2


def test_requeue_leaves_the_new_outcome_of_a_run_that_already_ran_again() -> None:
    """A requeued run may be claimed, run and ended before its row is marked queued (a bulk
    requeue marked them all after its last batch): its new outcome must stay, or repair runs a
    job that succeeded again."""
    from datetime import UTC, datetime, timedelta

    from kumiko_jobs import records

    ran_again, waiting = dispatch("tests.unrecoverable", {}), dispatch("tests.unrecoverable", {})
    assert drain() == {"failed": 2}
    before = records.finish_times([ran_again.job_id, waiting.job_id])
    # What a worker writes when the requeued run ends again, before the requeue's own write.
    JobRun.objects.filter(pk=ran_again.run_id).update(
        status=RunStatus.SUCCEEDED, finished_at=datetime.now(UTC) + timedelta(seconds=1)
    )
    records.mark_requeued_by_operator(
        [ran_again.job_id, waiting.job_id], now=datetime.now(UTC), finished_before=before
    )
    assert JobRun.objects.get(pk=ran_again.run_id).status == RunStatus.SUCCEEDED
    assert JobRun.objects.get(pk=waiting.run_id).status == RunStatus.QUEUED


def test_requeue_a_scheduled_run_runs_it_now_and_refuses_a_queued_one(redis_client: Any) -> None:
    later = dispatch("tests.record", {}, delay=3600)
    now = dispatch("tests.record", {})
    result = requeue_jobs([later.job_id, now.job_id])
    assert result.requeued == (later.job_id,)
    assert result.refused == {now.job_id: "it is queued"}
    assert drain(timeout=0.5) == {"succeeded": 2}


def test_each_batch_of_a_cancel_is_recorded_before_the_next(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Emptying a deep lane is many batches in one request: one cut off midway (a proxy timeout,
    here a failing script) leaves the batches it canceled recorded, not queued rows that repair
    settles 200 a minute."""
    import redis

    from kumiko_jobs import cancelling
    from kumiko_jobs.scripts import scripts_for

    first, second = dispatch("tests.record", {"n": 1}), dispatch("tests.record", {"n": 2})
    monkeypatch.setattr(cancelling, "BATCH", 1)
    scripts = scripts_for(redis_client)
    real, calls = scripts.cancel, []

    def cut_off_after_one(**kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            raise redis.TimeoutError("the request was cut off")
        return real(**kwargs)

    monkeypatch.setattr(scripts, "cancel", cut_off_after_one)
    with pytest.raises(redis.TimeoutError):
        cancel_queued([first.job_id, second.job_id])
    assert JobRun.objects.get(pk=first.run_id).status == RunStatus.DROPPED
    assert JobRun.objects.get(pk=second.run_id).status == RunStatus.QUEUED


def test_a_queued_run_redis_does_not_hold_is_canceled_through_its_record(
    settings: Any, redis_client: Any
) -> None:
    """Committed while Redis was down, it waits for the outbox; canceling it said "no such job",
    and the outbox then pushed it, so it ran."""
    from django.db import transaction

    from kumiko_jobs.rebuild import push_waiting

    real = settings.KUMIKO_JOBS
    settings.KUMIKO_JOBS = {**real, "REDIS_URL": "redis://127.0.0.1:1/0", "REDIS_TIMEOUT": 0.2}
    with transaction.atomic():
        waiting = dispatch("tests.record", {"n": 1})
    settings.KUMIKO_JOBS = real
    result = cancel_queued([waiting.job_id, "no-such-job"])
    assert result.canceled == (waiting.job_id,)
    assert result.refused == {"no-such-job": "no such job"}
    assert JobRun.objects.get(pk=waiting.run_id).status == RunStatus.DROPPED
    JobRun.objects.filter(pk=waiting.run_id).update(queued_at=timezone.now() - timedelta(minutes=5))
    push_waiting(redis_client, get_keys(), "worker")
    assert drain() == {}
