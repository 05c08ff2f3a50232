"""Metrics (metrics.py) with the SDK's in-memory reader: every instrument of the contract, its
unit and attributes; queue depth from Redis in O(1) per lane (the Lua-kept queued count)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from kumiko_jobs import MaxPerTenant, dispatch
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.execution import run_claimed
from kumiko_jobs.lane import Claim, Finished, count_claims, finish_and_claim
from kumiko_jobs.metrics import lane_depths
from kumiko_jobs.registry import registry
from kumiko_jobs.testing import drain
from tests.otel import install_sdk, metric_unit, points, value

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sdk() -> None:
    # Before the test's jobs run: what is recorded before the SDK exists goes nowhere.
    install_sdk()


def counted(name: str, **attributes: str) -> float:
    return value(name, **attributes) or 0


def depth() -> dict[tuple[str, str], float]:
    mine = {"api", "worker"}
    return {
        (str(p.attributes["lane"]), str(p.attributes["state"])): p.value
        for p in points("kumiko.jobs.depth")
        if p.attributes and p.attributes["lane"] in mine
    }


def claim_one(lane: str = "worker") -> Any:
    job = finish_and_claim(get_redis(), get_keys(), lane, claim=Claim("test", "x", time.time() + 60))
    # What a worker does with its claims within a second (they are counted off in batches).
    count_claims(get_redis(), get_keys(), lane, 1 if job else 0)
    return job


def test_depth_per_lane_and_state(tenants: list[Any]) -> None:
    assert depth() == {
        (lane, state): 0
        for lane in ("api", "worker")
        for state in ("queued", "scheduled", "running", "failed")
    }
    for tenant in tenants:
        dispatch("tests.record", {}, tenant=tenant)
    dispatch("tests.api_record", {})
    dispatch("tests.record", {}, delay=3600)
    dispatch("tests.unrecoverable", {})
    assert depth()[("worker", "queued")] == len(tenants) + 1
    assert depth()[("api", "queued")] == 1
    assert depth()[("worker", "scheduled")] == 1
    job = claim_one()
    assert (depth()[("worker", "queued")], depth()[("worker", "running")]) == (len(tenants), 1)
    outcome = run_claimed(job, worker="test", consumer_lane="worker")
    finish_and_claim(get_redis(), get_keys(), "worker", Finished(job.job_id, f"{job.job_id}:x", outcome))
    drain(timeout=0.5)
    assert depth()[("worker", "queued")] == depth()[("worker", "running")] == 0
    assert depth()[("worker", "failed")] == 1  # tests.unrecoverable
    assert depth()[("worker", "scheduled")] == 1  # still waiting an hour
    assert metric_unit("kumiko.jobs.depth") == "{job}"


def test_queued_count_follows_replace_and_stock_rq_pushes(tenants: list[Any], redis_client: Any) -> None:
    tenant = str(tenants[0].pk)
    for i in range(3):
        dispatch("tests.replacing", {"i": i}, tenant=tenant)  # each drops the waiting ones
    assert lane_depths(redis_client, get_keys())["worker"]["queued"] == 1
    # A stock RQ push onto the plain list counts as queued until a claim sweeps it into its flow.
    other = dispatch("tests.record", {}, delay=3600)
    redis_client.zrem(get_keys().scheduled("worker"), other.job_id)
    redis_client.rpush(get_keys().queue("worker"), other.job_id)
    assert lane_depths(redis_client, get_keys())["worker"]["queued"] == 2
    assert drain() == {"succeeded": 2}
    assert lane_depths(redis_client, get_keys())["worker"]["queued"] == 0


def test_an_idle_lane_resets_a_drifted_count(redis_client: Any) -> None:
    redis_client.set(get_keys().queued_count("worker"), 7)  # e.g. flow keys deleted by hand
    assert claim_one() is None
    assert lane_depths(redis_client, get_keys())["worker"]["queued"] == 0


def test_depth_reads_o1_commands_per_lane(tenants: list[Any], redis_client: Any) -> None:
    # However many tenants (flows) hold work, the callback's pipeline is 5 commands per lane.
    for tenant in tenants:
        for _ in range(3):
            dispatch("tests.record", {}, tenant=tenant)
    calls: list[int] = []
    original = redis_client.pipeline

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = original(*args, **kwargs)
        execute = pipe.execute

        def run(*a: Any, **k: Any) -> Any:
            calls.append(len(pipe.command_stack))
            return execute(*a, **k)

        pipe.execute = run
        return pipe

    redis_client.pipeline = counting_pipeline
    try:
        assert lane_depths(redis_client, get_keys())["worker"]["queued"] == 3 * len(tenants)
    finally:
        redis_client.pipeline = original
    assert calls == [10]


def test_run_duration_by_job_and_outcome() -> None:
    ok = counted("kumiko.jobs.run.duration", job="tests.flaky", outcome="succeeded")
    retried = counted("kumiko.jobs.run.duration", job="tests.flaky", outcome="retried")
    dispatch("tests.flaky", {"succeed_on": 2})
    drain()
    assert counted("kumiko.jobs.run.duration", job="tests.flaky", outcome="succeeded") == ok + 1
    assert counted("kumiko.jobs.run.duration", job="tests.flaky", outcome="retried") == retried + 1
    [point] = [
        p
        for p in points("kumiko.jobs.run.duration")
        if dict(p.attributes) == {"job": "tests.flaky", "outcome": "succeeded"}
    ]
    assert 0 < point.sum < 10 * point.count  # seconds, not milliseconds
    assert point.explicit_bounds[0] == 0.005
    assert metric_unit("kumiko.jobs.run.duration") == "s"


def test_last_success_is_stamped_by_children_not_by_fan_out_wrappers(tenants: list[Any]) -> None:
    before = time.time()
    dispatch("tests.per_tenant", {})
    drain()
    stamp = value("kumiko.jobs.last_success", job="tests.per_tenant")
    # Stamped at most once a second per job: a success in the same second as an earlier one
    # keeps the earlier stamp.
    assert stamp is not None and before - 1 <= stamp <= time.time()
    assert not [p for p in points("kumiko.jobs.last_success") if str(p.attributes["job"]).startswith("_")]
    assert metric_unit("kumiko.jobs.last_success") == "s"


def test_failures_never_stamp_last_success() -> None:
    dispatch("tests.unrecoverable", {})
    drain()
    assert value("kumiko.jobs.last_success", job="tests.unrecoverable") is None


def test_escape_hatch_uses_by_job_and_kind(tenants: list[Any]) -> None:
    before = counted("kumiko.jobs.escape_hatch.uses", job="tests.hatch", kind="unscoped")
    for _ in range(2):  # the second use is deduplicated in the audit, still counted here
        dispatch("tests.hatch", {}, tenant=tenants[0])
    drain()
    assert counted("kumiko.jobs.escape_hatch.uses", job="tests.hatch", kind="unscoped") == before + 2


def test_refusals_by_job_and_reason(tenants: list[Any]) -> None:
    before = counted("kumiko.jobs.refused", job="tests.limited", reason="max_per_tenant")
    results = [dispatch("tests.limited", {}, tenant=tenants[0]) for _ in range(5)]
    assert [r.status for r in results].count("skipped") == 2
    assert counted("kumiko.jobs.refused", job="tests.limited", reason="max_per_tenant") == before + 2


def test_deferrals_by_job_and_reason(tenants: list[Any], settings: Any) -> None:
    handler = counted("kumiko.jobs.deferrals", job="tests.defer", reason="handler")
    dispatch("tests.defer", {"times": 2, "ms": 10})
    drain()
    assert counted("kumiko.jobs.deferrals", job="tests.defer", reason="handler") == handler + 2

    unknown = counted("kumiko.jobs.deferrals", job="tests.record", reason="unknown_job")
    result = dispatch("tests.record", {})
    original = registry._jobs.pop("tests.record")
    try:
        run_claimed(claim_one(), worker="test", consumer_lane="worker")
    finally:
        registry._jobs["tests.record"] = original
    assert counted("kumiko.jobs.deferrals", job="tests.record", reason="unknown_job") == unknown + 1
    assert result.job_id

    # A deploy lowered a cap below what is running: the run is put back without an attempt.
    tenant = str(tenants[0].pk)
    over_cap = counted("kumiko.jobs.deferrals", job="tests.capped", reason="over_cap")
    for i in range(2):
        dispatch("tests.capped", {"i": i}, tenant=tenant)
    first, second = claim_one(), claim_one()
    capped = registry.get("tests.capped")
    registry._jobs["tests.capped"] = dataclasses.replace(
        capped, max_per_tenant=MaxPerTenant(1, on_limit="defer")
    )
    try:
        assert run_claimed(second, worker="test", consumer_lane="worker").counted_as == "requeued"
    finally:
        registry._jobs["tests.capped"] = capped
    assert counted("kumiko.jobs.deferrals", job="tests.capped", reason="over_cap") == over_cap + 1
    assert first is not None
