"""Tenancy gates at the Redis level: caps, skip limits, sequential, replace, debounce, fairness.

Workers are simulated by claiming without finishing (what several live workers do), so the
assertions see exactly which run each worker would get.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connections

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.lane import Claim, ClaimedJob, Finished, finish_and_claim, promote_due
from kumiko_jobs.leases import reap
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.outcomes import Outcome, Release
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


class Lane:
    """Claims and finishes on one lane like a worker would, without running handlers."""

    def __init__(self, lane: str = "worker") -> None:
        self.lane, self.keys, self.client = lane, get_keys(), get_redis()

    def claim(self, deadline: float | None = None) -> ClaimedJob | None:
        claim = Claim("sim", "x", deadline or time.time() + 60)
        return finish_and_claim(self.client, self.keys, self.lane, claim=claim)

    def finish(self, job: ClaimedJob) -> None:
        meta = JobMeta.from_json(job.meta_raw)
        outcome = Outcome("ok", "succeeded", Release(meta.flow, meta.limit_keys), ttl=60)
        finish_and_claim(self.client, self.keys, self.lane, Finished(job.job_id, f"{job.job_id}:x", outcome))

    def label(self, job: ClaimedJob | None) -> str | None:
        if job is None:
            return None
        meta = JobMeta.from_json(job.meta_raw)
        return f"{meta.job_name}@{meta.tenant_id}"


def test_defer_cap_parks_only_that_job_and_tenant(tenants: list[Any]) -> None:
    a, b = (str(t.pk) for t in tenants[:2])
    first = [dispatch("tests.capped", {"i": i}, tenant=a) for i in range(5)]
    dispatch("tests.record", {}, tenant=a)
    dispatch("tests.capped", {}, tenant=b)
    lane = Lane()
    held = [lane.claim() for _ in range(4)]
    assert sorted(lane.label(j) or "" for j in held) == sorted(
        [f"tests.capped@{a}", f"tests.capped@{a}", f"tests.record@{a}", f"tests.capped@{b}"]
    )
    assert lane.claim() is None  # A's capped job is parked: not popped, not spun on
    assert get_redis().llen(get_keys().flow("worker", f"c2|tests.capped|{a}")) == 3
    lane.finish(next(j for j in held if j and lane.label(j) == f"tests.capped@{a}"))
    nxt = lane.claim()
    assert lane.label(nxt) == f"tests.capped@{a}"
    # FIFO within the flow, and no attempt consumed while waiting.
    assert JobMeta.from_json(nxt.meta_raw).run_id == first[2].run_id  # type: ignore[union-attr]
    assert JobMeta.from_json(nxt.meta_raw).attempt == 1  # type: ignore[union-attr]


def test_skip_limit_is_atomic_under_20_concurrent_dispatchers(tenants: list[Any]) -> None:
    tenant = str(tenants[0].pk)

    def one(i: int) -> str:
        try:
            return dispatch("tests.limited", {"i": i}, tenant=tenant).status
        finally:
            connections.close_all()  # threads own their connections

    with ThreadPoolExecutor(max_workers=20) as pool:
        statuses = list(pool.map(one, range(20)))
    assert statuses.count("queued") == 3 and statuses.count("skipped") == 17
    assert JobRun.objects.filter(job_name="tests.limited").count() == 3
    skipped = dispatch("tests.limited", {}, tenant=tenant)
    assert (skipped.status, skipped.reason, skipped.job_id) == ("skipped", "max_per_tenant", None)
    assert dispatch("tests.limited", {}, tenant=str(tenants[1].pk)).status == "queued"  # other tenant
    drain()
    assert dispatch("tests.limited", {}, tenant=tenant).status == "queued"  # slots freed on finish


def test_limit_counts_retrying_runs_until_they_end(tenants: list[Any], redis_client: Any) -> None:
    tenant = str(tenants[0].pk)
    for _ in range(3):
        dispatch("tests.limited", {}, tenant=tenant)
    assert redis_client.hget(get_keys().active, f"m|tests.limited|{tenant}") == b"3"
    drain()
    assert redis_client.hget(get_keys().active, f"m|tests.limited|{tenant}") is None


def test_concurrency_skip_while_one_is_queued_or_running() -> None:
    assert dispatch("tests.skipping", {}).status == "queued"
    second = dispatch("tests.skipping", {})
    assert (second.status, second.reason) == ("skipped", "concurrency")
    lane = Lane()
    job = lane.claim()
    assert job is not None and dispatch("tests.skipping", {}).status == "skipped"  # running
    lane.finish(job)
    assert dispatch("tests.skipping", {}).status == "queued"


def test_sequential_runs_one_at_a_time_in_fifo_order(tenants: list[Any]) -> None:
    tenant = str(tenants[0].pk)
    results = [dispatch("tests.sequential", {"i": i}, tenant=tenant) for i in range(3)]
    other = dispatch("tests.sequential", {}, tenant=str(tenants[1].pk))  # scope "tenant": own key
    lane = Lane()
    first, second = lane.claim(), lane.claim()
    assert first and second
    assert {JobMeta.from_json(j.meta_raw).run_id for j in (first, second)} == {
        results[0].run_id,
        other.run_id,
    }
    assert lane.claim() is None
    order = []
    job: ClaimedJob | None = (
        first if JobMeta.from_json(first.meta_raw).run_id == results[0].run_id else second
    )
    while job is not None:
        order.append(JobMeta.from_json(job.meta_raw).run_id)
        assert lane.claim() is None  # the key is held: nothing else of it starts
        lane.finish(job)
        job = lane.claim()
    assert order == [r.run_id for r in results]


def test_dead_sequential_holder_frees_the_key(tenants: list[Any], settings: Any) -> None:
    dispatch("tests.sequential", {"i": 0})
    waiting = dispatch("tests.sequential", {"i": 1})
    lane = Lane()
    assert lane.claim(deadline=time.time() - 1) is not None  # holder whose lease already ran out
    assert lane.claim() is None
    reap(get_redis(), get_keys(), "worker", "reaper")
    # The dead holder's run is retried (queued again behind the waiting one) and the key frees.
    nxt = lane.claim()
    assert nxt is not None and JobMeta.from_json(nxt.meta_raw).run_id == waiting.run_id


def test_replace_drops_waiting_runs_of_the_key(tenants: list[Any]) -> None:
    tenant = str(tenants[0].pk)
    old = [dispatch("tests.replacing", {"v": v}, tenant=tenant) for v in (1, 2)]
    other_tenant = dispatch("tests.replacing", {"v": 9}, tenant=str(tenants[1].pk))
    last = dispatch("tests.replacing", {"v": 3}, tenant=tenant)
    assert {r.status for r in JobRun.objects.filter(pk__in=[o.run_id for o in old])} == {RunStatus.DROPPED}
    assert JobRun.objects.get(pk=other_tenant.run_id).status == RunStatus.QUEUED
    assert drain() == {"succeeded": 2}
    assert JobRun.objects.get(pk=last.run_id).status == RunStatus.SUCCEEDED


def test_replace_under_a_skip_limit_replaces_the_waiting_run(tenants: list[Any]) -> None:
    """max_per_tenant=1 with replace: a new run takes the waiting run's place (before, the limit
    refused it and the stale run stayed); with one running and none waiting it is refused."""
    tenant = str(tenants[0].pk)
    first = dispatch("tests.replacing_limited", {"v": 1}, tenant=tenant)
    second = dispatch("tests.replacing_limited", {"v": 2}, tenant=tenant)
    assert (second.status, second.reason) == ("queued", None)
    assert JobRun.objects.get(pk=first.run_id).status == RunStatus.DROPPED
    lane = Lane()
    running = lane.claim()
    assert running is not None and running.job_id == second.job_id
    third = dispatch("tests.replacing_limited", {"v": 3}, tenant=tenant)
    assert (third.status, third.reason) == ("skipped", "max_per_tenant")
    lane.finish(running)
    fourth = dispatch("tests.replacing_limited", {"v": 4}, tenant=tenant)
    assert fourth.status == "queued"
    assert drain() == {"succeeded": 1}
    assert get_redis().hlen(get_keys().active) == 0  # every limit count given back


def test_debounce_collapses_rapid_dispatches_into_one_run(traces: Any) -> None:
    results = [dispatch("tests.debounced", {"v": v}) for v in range(5)]
    assert len({r.job_id for r in results}) == 1
    assert [r.reason for r in results] == [None, "debounced", "debounced", "debounced", "debounced"]
    assert drain(timeout=2) == {"succeeded": 1}
    [run] = traces("debounced_start")
    assert run["payload"] == {"v": 4}
    assert JobRun.objects.get(pk=results[0].run_id).payload == {"v": 4}


def test_new_tenant_is_served_next_behind_a_big_backlog(tenants: list[Any]) -> None:
    a, b = str(tenants[0].pk), str(tenants[1].pk)
    from kumiko_jobs.preparing import prepare
    from kumiko_jobs.pushing import push
    from kumiko_jobs.registry import registry

    definition = registry.get("tests.record")
    push([prepare(definition, {"i": i}, tenant_id=a, user_id=None) for i in range(2000)])
    lane = Lane()
    assert lane.label(lane.claim()) == f"tests.record@{a}"
    dispatch("tests.record", {}, tenant=b)
    assert lane.label(lane.claim()) == f"tests.record@{b}"


def test_round_robin_between_busy_tenants(tenants: list[Any]) -> None:
    a, b = str(tenants[0].pk), str(tenants[1].pk)
    for _ in range(3):
        dispatch("tests.record", {}, tenant=a)
    for _ in range(3):
        dispatch("tests.record", {}, tenant=b)
    lane = Lane()
    order = [lane.label(lane.claim()) for _ in range(6)]
    assert [o.split("@")[1] for o in order if o] in ([b, a, b, a, b, a], [a, b, a, b, a, b])


def test_stock_rq_push_is_swept_into_its_flow(redis_client: Any) -> None:
    result = dispatch("tests.record", {}, delay=30)
    keys = get_keys()
    # What RQ's scheduler or the dashboard's "requeue" do: push the id onto the plain list.
    redis_client.zrem(keys.scheduled("worker"), result.job_id)
    redis_client.rpush(keys.queue("worker"), result.job_id)
    promote_due(redis_client, keys, "worker")
    assert redis_client.llen(keys.queue("worker")) == 0
    assert drain() == {"succeeded": 1}


def test_django_rq_queue_counts_and_lists_flows(tenants: list[Any]) -> None:
    from kumiko_jobs.dashboard.queue import LaneQueue

    ids = [dispatch("tests.record", {}, tenant=t).job_id for t in tenants]
    ids.append(dispatch("tests.capped", {}, tenant=tenants[0]).job_id)
    queue = LaneQueue(get_keys().queue_name("worker"), connection=get_redis())
    assert queue.count == 4
    assert sorted(queue.get_job_ids()) == sorted(ids)
    assert len(queue.get_job_ids(1, 2)) == 2


def test_cap_lowered_while_runs_wait_holds_them_back_without_attempts(tenants: list[Any]) -> None:
    """Runs queued under cap 2 that reach a worker after a deploy lowered the cap to 1 are put
    back (no attempt consumed) while the tenant has a run going; new runs wait parked."""
    import dataclasses

    from kumiko_jobs import MaxPerTenant
    from kumiko_jobs.execution import run_claimed
    from kumiko_jobs.registry import registry

    tenant = str(tenants[0].pk)
    queued = [dispatch("tests.capped", {"i": i}, tenant=tenant) for i in range(3)]
    lane = Lane()
    first = lane.claim()
    assert first is not None
    original = registry.get("tests.capped")
    registry._jobs["tests.capped"] = dataclasses.replace(
        original, max_per_tenant=MaxPerTenant(1, on_limit="defer", defer_ms=50)
    )
    try:
        late = dispatch("tests.capped", {"late": True}, tenant=tenant)
        assert get_redis().hget(get_keys().lane("worker") + "st", f"c1|tests.capped|{tenant}") == b"p"
        second = lane.claim()  # from the old cap-2 flow: the claim itself cannot know the new cap
        assert second is not None
        outcome = run_claimed(second, worker="sim", consumer_lane="worker")
        assert (outcome.kind, outcome.counted_as) == ("retry", "requeued")
        row = JobRun.objects.get(pk=queued[1].run_id)
        assert (row.status, row.attempt) == (RunStatus.QUEUED, 1)
        assert "the cap is now 1" in row.logs[-1]["msg"]
        lane.finish(first)
        finish_and_claim(
            get_redis(), get_keys(), "worker", Finished(second.job_id, f"{second.job_id}:x", outcome)
        )
        # With the tenant's slot free, everything still runs, one at a time, none lost.
        counts = drain(timeout=5)
        assert counts == {"succeeded": 3}
        assert JobRun.objects.get(pk=late.run_id).status == RunStatus.SUCCEEDED
    finally:
        registry._jobs["tests.capped"] = original


def test_fallback_delay_grows_per_deferral_and_is_capped() -> None:
    from kumiko_jobs.cap_fallback import fallback_delay_ms

    for n, base in [(0, 1000), (1, 2000), (3, 8000), (6, 60_000), (9, 60_000)]:
        delays = {fallback_delay_ms(1000, n) for _ in range(50)}
        assert all(base <= d < base + 1000 for d in delays), (n, delays)
        assert len(delays) > 1  # jittered
    assert fallback_delay_ms(100_000, 0) >= 60_000  # the cap applies before the jitter


def test_replace_keeps_a_defer_cap(tenants: list[Any]) -> None:
    tenant = str(tenants[0].pk)
    first = dispatch("tests.capped_replacing", {"n": 1}, tenant=tenant)
    lane = Lane()
    running = lane.claim()
    assert running is not None and running.job_id == first.job_id
    second = dispatch("tests.capped_replacing", {"n": 2}, tenant=tenant)
    third = dispatch("tests.capped_replacing", {"n": 3}, tenant=tenant)
    # The cap (1 per tenant) holds while the first runs, and replace kept only the newest waiting.
    assert lane.claim() is None
    assert JobRun.objects.get(pk=second.run_id).status == RunStatus.DROPPED
    lane.finish(running)
    nxt = lane.claim()
    assert nxt is not None and nxt.job_id == third.job_id


def test_a_flow_parked_under_a_lowered_cap_is_served_once_a_push_finds_room(tenants: list[Any]) -> None:
    """A deploy lowered tests.capped's cap from 2 to 1 while a run went on. A worker of the old
    deploy finishes it naming only the old flow, so nothing unparks the new one, which shares
    its counter; the next push into it looks again (before, it stayed parked for good)."""
    import dataclasses

    from kumiko_jobs import MaxPerTenant
    from kumiko_jobs.registry import registry

    tenant = str(tenants[0].pk)
    dispatch("tests.capped", {"old": True}, tenant=tenant)
    lane = Lane()
    running = lane.claim()
    assert running is not None
    original = registry.get("tests.capped")
    registry._jobs["tests.capped"] = dataclasses.replace(original, max_per_tenant=MaxPerTenant(1, "defer"))
    try:
        late = dispatch("tests.capped", {"late": 1}, tenant=tenant)
        state = get_keys().lane("worker") + "st"
        assert get_redis().hget(state, f"c1|tests.capped|{tenant}") == b"p"
        lane.finish(running)  # as an old worker: Release(flow="c2|...") and no current flow
        assert lane.claim() is None  # parked still: no push came since
        later = dispatch("tests.capped", {"late": 2}, tenant=tenant)
        served = lane.claim()
        assert served is not None and served.job_id == late.job_id
        lane.finish(served)
        nxt = lane.claim()
        assert nxt is not None and nxt.job_id == later.job_id
    finally:
        registry._jobs["tests.capped"] = original


def test_a_merged_debounce_keeps_its_key_as_long_as_the_pending_run_waits(redis_client: Any) -> None:
    from kumiko_jobs.gates import gates_for
    from kumiko_jobs.registry import registry

    key = gates_for(registry.get("tests.debounced"), None, get_keys()).debounce_key
    first = dispatch("tests.debounced", {"v": 1})
    ttl = redis_client.pttl(key)
    assert 1000 < ttl <= 1400  # 2 x 200 ms + 1 s
    time.sleep(0.5)
    again = dispatch("tests.debounced", {"v": 2})
    assert again.job_id == first.job_id
    # Extended with the wait (before, it kept its first TTL: a burst longer than that started a
    # second pending run beside the first).
    assert redis_client.pttl(key) > ttl - 100


def test_a_stock_rq_push_of_an_id_whose_hash_is_gone_leaves_no_stray_hash(redis_client: Any) -> None:
    keys = get_keys()
    ghost = f"{keys.id_tag}-ghost"
    redis_client.rpush(keys.queue("worker"), ghost)
    promote_due(redis_client, keys, "worker")
    assert redis_client.llen(keys.queue("worker")) == 0
    assert not redis_client.exists(keys.job(ghost))
    assert drain() == {}


def test_a_job_with_unreadable_meta_gives_back_its_cap_slot(redis_client: Any, tenants: list[Any]) -> None:
    tenant = str(tenants[0].pk)
    result = dispatch("tests.capped", {}, tenant=tenant)
    keys = get_keys()
    redis_client.hset(keys.job(result.job_id), "meta", "{not json")
    assert drain() == {"failed": 1}
    # The claim counted it in its (job, tenant) scope; the failure, with no meta to name the
    # flow, finds it in the hash (before, the slot stayed taken and the scope at cap 1 parked).
    assert redis_client.hget(keys.running("worker"), f"|tests.capped|{tenant}") is None
    runs = [dispatch("tests.capped", {"i": i}, tenant=tenant) for i in range(2)]
    assert drain() == {"succeeded": 2}
    assert {JobRun.objects.get(pk=r.run_id).status for r in runs} == {RunStatus.SUCCEEDED}


def test_a_batch_push_names_the_limit_that_refused_a_job(tenants: list[Any]) -> None:
    from kumiko_jobs.preparing import prepare
    from kumiko_jobs.pushing import push_batch
    from kumiko_jobs.registry import registry

    definition = registry.get("tests.limited")  # max_per_tenant=3, skip
    prepared = [prepare(definition, {}, tenant_id=str(tenants[0].pk), user_id=None) for _ in range(5)]
    pushed = push_batch(prepared)
    assert [(p.status, p.reason) for p in pushed] == [("queued", None)] * 3 + [
        ("skipped", "max_per_tenant")
    ] * 2


def test_a_replace_push_over_a_run_whose_hash_was_lost_releases_its_limit(
    tenants: list[Any], redis_client: Any
) -> None:
    """The waiting run's hash is gone (deleted, evicted): its skip limit was counted at its push,
    as the new run's is (same job and tenant). The replace push credits and forgets it; before,
    the lost run's slot refused the new run (max_per_tenant=1) and was never given back."""
    from kumiko_jobs.connection import get_keys
    from kumiko_jobs.testing import drain

    tenant = str(tenants[0].pk)
    lost = dispatch("tests.replacing_limited", {"n": 1}, tenant=tenant)
    redis_client.delete(get_keys().job(lost.job_id))
    newer = dispatch("tests.replacing_limited", {"n": 2}, tenant=tenant)
    assert newer.status == "queued"
    assert not redis_client.exists(get_keys().job(lost.job_id))  # no stub hash made for it
    assert drain() == {"succeeded": 1}
    assert redis_client.hlen(get_keys().active) == 0  # every limit count given back
