"""Leases and the reaper (leases.py): crash-safe at every step, and never re-running a run whose
worker recorded its outcome before dying."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.lane import Claim, Finished, finish_and_claim
from kumiko_jobs.leases import _outcome_of_abandoned, reap
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.outcomes import Outcome, Release
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def claim_expired() -> Any:
    """A worker claims a job and dies: its lease has already run out."""
    job = finish_and_claim(get_redis(), get_keys(), "worker", claim=Claim("dead", "x", time.time() - 1))
    assert job is not None
    return job


def test_reaper_that_dies_after_the_record_leaves_the_run_for_the_next(traces: Any) -> None:
    result = dispatch("tests.record", {"n": 1})
    job = claim_expired()
    # A reaper writes the retry record, then dies before the reap script (the crash point).
    _outcome_of_abandoned(job.job_id, JobMeta.from_json(job.meta_raw))
    started = get_keys().started("worker")
    assert get_redis().zcard(started) == 1  # still registered: nobody lost it
    assert reap(get_redis(), get_keys(), "worker", "next-reaper") == 1
    assert get_redis().zcard(started) == 0
    assert drain() == {"succeeded": 1}
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.attempt) == (RunStatus.SUCCEEDED, 2)
    assert len(traces("record")) == 1


def test_recorded_outcome_is_told_to_redis_not_run_again(traces: Any, redis_client: Any) -> None:
    result = dispatch("tests.record", {"n": 1})
    job = claim_expired()
    # The worker wrote "succeeded", then died before its finish reached Redis.
    JobRun.objects.filter(pk=result.run_id).update(
        status=RunStatus.SUCCEEDED, finished_at="2026-01-01T00:00Z"
    )
    assert reap(redis_client, get_keys(), "worker", "reaper") == 1
    assert not redis_client.exists(get_keys().job(job.job_id))  # succeeded: gone (RESULT_TTL 0)
    assert redis_client.zcard(get_keys().started("worker")) == 0
    assert drain() == {}
    assert traces("record") == []


def test_a_worker_that_lost_its_lease_cannot_finish_the_run_again(redis_client: Any) -> None:
    result = dispatch("tests.limited", {}, tenant=None)
    job = claim_expired()
    reap(redis_client, get_keys(), "worker", "reaper")  # back in its flow, attempt 2
    meta = JobMeta.from_json(job.meta_raw)
    stale = Outcome("ok", "succeeded", Release(meta.flow, meta.limit_keys), ttl=60)
    # The stalled worker wakes up and reports success with its old lease member.
    finish_and_claim(redis_client, get_keys(), "worker", Finished(job.job_id, f"{job.job_id}:x", stale))
    assert redis_client.hget(get_keys().job(job.job_id), "status") == b"queued"
    assert drain() == {"succeeded": 1}
    assert JobRun.objects.get(pk=result.run_id).status == RunStatus.SUCCEEDED


def test_lost_hash_of_an_abandoned_run_gives_back_its_cap_slot(tenants: list[Any], redis_client: Any) -> None:
    tenant = str(tenants[0].pk)
    runs = [dispatch("tests.capped", {"i": i}, tenant=tenant) for i in range(3)]  # cap 2 per tenant
    claim_expired()
    second = finish_and_claim(redis_client, get_keys(), "worker", claim=Claim("w", "y", time.time() + 60))
    assert second is not None
    redis_client.delete(get_keys().job(runs[0].job_id))  # the dead worker's job vanished
    assert (
        finish_and_claim(redis_client, get_keys(), "worker", claim=Claim("w", "z", time.time() + 60)) is None
    )
    reap(redis_client, get_keys(), "worker", "reaper")
    third = finish_and_claim(redis_client, get_keys(), "worker", claim=Claim("w", "z", time.time() + 60))
    assert third is not None and third.job_id == runs[2].job_id  # the slot came back


def test_the_heartbeat_outlives_an_error_that_is_not_redis(settings: Any, redis_client: Any) -> None:
    """A heartbeat thread that died let the leases of running jobs lapse, and the reaper ran them
    again beside them; an error of its own (here: re-registering after Redis lost the worker's
    key fails) is logged, and the next beat renews the leases."""
    from kumiko_jobs.leases import Heartbeat

    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "HEARTBEAT_INTERVAL": 0.05}
    keys = get_keys()
    member = "some-job:exec"
    redis_client.zadd(keys.started("worker"), {member: time.time() + 1})
    failures: list[str] = []

    def register_again() -> None:
        failures.append("lost")
        raise RuntimeError("cannot register again")

    heartbeat = Heartbeat(
        get_redis(), keys, "worker", f"{keys.prefix}:no-such-worker", on_lost=register_again
    )
    heartbeat.hold(member)
    heartbeat.start()
    try:
        time.sleep(0.4)
        assert heartbeat.is_alive() and len(failures) >= 2
        # Renewed to ABANDON_AFTER from now by the latest beat, not left at its first second.
        assert redis_client.zscore(keys.started("worker"), member) > time.time() + 5
    finally:
        heartbeat.stop()
        heartbeat.join(timeout=5)


def test_a_reaper_that_lost_its_lock_stops_before_the_next_record(
    monkeypatch: pytest.MonkeyPatch, redis_client: Any
) -> None:
    """A pass that outlives its lock (a slow database): the reaper that took the lock over reaps
    the rest, and the first writes no second record of them (each would count an attempt)."""
    from kumiko_jobs import leases

    first, second = dispatch("tests.record", {"n": 1}), dispatch("tests.record", {"n": 2})
    claim_expired()
    claim_expired()
    lock = get_keys().reaper_lock("worker")
    real = leases._reap_one
    calls: list[str] = []

    def slow_reap_one(*args: Any) -> int:
        calls.append(args[3])
        reaped = real(*args)
        redis_client.set(lock, "other-reaper", px=4000)  # this pass took longer than its lock
        return reaped

    monkeypatch.setattr(leases, "_reap_one", slow_reap_one)
    assert reap(redis_client, get_keys(), "worker", "slow-reaper") == 1
    assert len(calls) == 1
    attempts = sorted(
        JobRun.objects.filter(pk__in=[first.run_id, second.run_id]).values_list("attempt", flat=True)
    )
    assert attempts == [1, 2]  # one retried, the other left for the lock's holder
    assert redis_client.zcard(get_keys().started("worker")) == 1


def test_a_reaper_skips_a_lease_renewed_since_it_listed_it(
    monkeypatch: pytest.MonkeyPatch, redis_client: Any
) -> None:
    from kumiko_jobs import leases

    result = dispatch("tests.record", {"n": 1})
    job = claim_expired()
    started = get_keys().started("worker")
    (member,) = redis_client.zrange(started, 0, -1)
    real_turn = leases.scripts_for(redis_client).reaper_turn

    def renewed_first(**kwargs: Any) -> Any:
        redis_client.zadd(started, {member: time.time() + 60})  # its heartbeat came after all
        return real_turn(**kwargs)

    monkeypatch.setattr(leases.scripts_for(redis_client), "reaper_turn", renewed_first)
    assert reap(redis_client, get_keys(), "worker", "reaper") == 0
    assert JobRun.objects.get(pk=result.run_id).attempt == 1
    assert redis_client.hget(get_keys().job(job.job_id), "status") == b"started"


def test_a_run_whose_record_is_ahead_of_redis_is_let_go_for_repair(redis_client: Any) -> None:
    """Refused by the record (it moved two attempts on, e.g. after Redis lost writes) and not
    finished: the reaper deletes the job hash, so the stale-run repair's lost-hash path pushes
    the run again from its record."""
    result = dispatch("tests.record", {"n": 1})
    job = claim_expired()
    JobRun.objects.filter(pk=result.run_id).update(attempt=3)
    assert reap(redis_client, get_keys(), "worker", "reaper") == 1
    assert not redis_client.exists(get_keys().job(job.job_id))
    assert redis_client.zcard(get_keys().started("worker")) == 0
    assert JobRun.objects.get(pk=result.run_id).attempt == 3


def test_a_reaper_that_stalls_after_its_turn_records_the_attempt_whose_lease_expired(
    monkeypatch: pytest.MonkeyPatch, redis_client: Any
) -> None:
    """The run's meta comes with the turn, in one step: read afterwards, it was the retry that a
    reaper which took the lock over had queued meanwhile, and the stalled reaper counted a
    second attempt over it."""
    from kumiko_jobs import leases

    result = dispatch("tests.record", {"n": 1})
    claim_expired()
    lock = get_keys().reaper_lock("worker")
    real_turn = leases.scripts_for(redis_client).reaper_turn
    taken_over: list[int] = []
    stalled: list[bool] = []

    def turn_then_stall(**kwargs: Any) -> Any:
        answer = real_turn(**kwargs)
        if not stalled:  # this reaper stalls past its lock; another reaps the run meanwhile
            stalled.append(True)
            redis_client.delete(lock)
            taken_over.append(reap(redis_client, get_keys(), "worker", "other-reaper"))
        return answer

    monkeypatch.setattr(leases.scripts_for(redis_client), "reaper_turn", turn_then_stall)
    assert reap(redis_client, get_keys(), "worker", "stalled-reaper") == 0  # the other's step won
    assert taken_over == [1]
    run = JobRun.objects.get(pk=result.run_id)
    # One abandoned attempt counted, as the other reaper did: not a second one, which (past the
    # one extra attempt an abandon grants) failed the run.
    assert (run.status, run.attempt) == (RunStatus.QUEUED, 2)


def test_a_hash_pushed_again_meanwhile_is_not_deleted_by_the_reaper(redis_client: Any) -> None:
    """The reaper lets a run go without an outcome only with the hash it saw: one that repair or
    the outbox pushed again in the meantime (another meta) stays."""
    result = dispatch("tests.record", {"n": 1})
    job = claim_expired()
    JobRun.objects.filter(pk=result.run_id).update(attempt=3)  # the record is ahead of Redis
    from kumiko_jobs import leases

    meta = JobMeta.from_json(job.meta_raw)
    outcome = leases._outcome_of_abandoned(job.job_id, meta, job.meta_raw.decode())
    assert (outcome.kind, outcome.meta) == ("", job.meta_raw.decode())
    redis_client.hset(get_keys().job(job.job_id), "meta", "pushed again")
    member = redis_client.zrange(get_keys().started("worker"), 0, -1)[0].decode()
    finish_and_claim(redis_client, get_keys(), "worker", Finished(job.job_id, member, outcome))
    assert redis_client.hget(get_keys().job(job.job_id), "meta") == b"pushed again"
