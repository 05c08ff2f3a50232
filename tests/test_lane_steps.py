"""Lane steps (lane.step, lua/finish_and_claim.lua) that carry several finishes and claims in one
script call, as the claimer of a --threads worker sends them (claiming.py), on real Redis."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.jobdata import JobMeta, rq_time
from kumiko_jobs.lane import Claim, ClaimedJob, Finished, Stepper, finish_and_claim, step
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.outcomes import Outcome, Release, given_back
from kumiko_jobs.scripts import FinishAndClaimArgs, argv, scripts_for

pytestmark = pytest.mark.django_db(transaction=True)


def _claims(count: int, tag: str = "c") -> list[Claim]:
    return [Claim("sim", f"{tag}{n}", time.time() + 60) for n in range(count)]


def _label(job: ClaimedJob) -> str:
    meta = JobMeta.from_json(job.meta_raw)
    return f"{meta.job_name}@{meta.tenant_id}"


def _finished(job: ClaimedJob, execution_id: str) -> Finished:
    meta = JobMeta.from_json(job.meta_raw)
    outcome = Outcome("ok", "succeeded", Release(meta.flow, meta.limit_keys), ttl=60)
    return Finished(job.job_id, f"{job.job_id}:{execution_id}", outcome)


def test_one_call_claims_as_separate_calls_would_caps_included(tenants: list[Any]) -> None:
    a, b = (str(t.pk) for t in tenants[:2])
    capped_a = [dispatch("tests.capped", {"i": i}, tenant=a) for i in range(5)]  # cap 2
    dispatch("tests.record", {}, tenant=a)
    dispatch("tests.capped", {}, tenant=b)
    client, keys = get_redis(), get_keys()
    claims = _claims(6)
    jobs = step(client, keys, "worker", [], claims)
    # Six claims, four runs claimable: A's capped flow stops at its cap of 2 within the call.
    assert sorted(_label(j) for j in jobs) == sorted(
        [f"tests.capped@{a}", f"tests.capped@{a}", f"tests.record@{a}", f"tests.capped@{b}"]
    )
    # Each claim leased under its own execution id, in claim order.
    started = {m.decode() for m in client.zrange(keys.started("worker"), 0, -1)}
    assert started == {f"{job.job_id}:{claim.execution_id}" for job, claim in zip(jobs, claims, strict=False)}
    # Finishing both of A's capped runs in one call frees both slots for the same call's claims.
    held = [(j, c) for j, c in zip(jobs, claims, strict=False) if _label(j) == f"tests.capped@{a}"]
    again = step(client, keys, "worker", [_finished(j, c.execution_id) for j, c in held], _claims(3, "d"))
    assert [JobMeta.from_json(j.meta_raw).run_id for j in again] == [r.run_id for r in capped_a[2:4]]
    assert step(client, keys, "worker", [], _claims(1, "e")) == []


def test_one_call_takes_tenants_in_ring_order(tenants: list[Any]) -> None:
    ids = [str(t.pk) for t in tenants[:3]]
    for tenant in ids:
        for n in range(3):
            dispatch("tests.record", {"n": n}, tenant=tenant)
    jobs = step(get_redis(), get_keys(), "worker", [], _claims(6))
    tenants_in_order = [JobMeta.from_json(j.meta_raw).tenant_id for j in jobs]
    # Round robin within one call, exactly as six calls: each tenant twice, never twice in a row.
    assert Counter(tenants_in_order) == dict.fromkeys(ids, 2)
    assert all(x != y for x, y in itertools.pairwise(tenants_in_order))


def test_a_failed_call_keeps_the_finished_attempt_for_the_next(tenants: list[Any]) -> None:
    dispatch("tests.record", {}, tenant=str(tenants[0].pk))
    client, keys = get_redis(), get_keys()
    claim = _claims(1)[0]
    job = finish_and_claim(client, keys, "worker", claim=claim)
    assert job is not None
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    with pytest.raises(redis.ConnectionError):
        Stepper(dead, keys, "worker").step([_finished(job, claim.execution_id)], _claims(1, "x"))
    # Nothing reached Redis: the lease is still held, and a retry on a live client finishes it.
    assert client.zscore(keys.started("worker"), f"{job.job_id}:{claim.execution_id}") is not None
    stepper = Stepper(client, keys, "worker")
    assert stepper.step([_finished(job, claim.execution_id)], []) == []
    assert client.zcard(keys.started("worker")) == 0
    assert (stepper.calls, stepper.carried) == (1, 1)
    stepper.close()


def test_a_job_given_back_is_first_in_its_flow_again_with_its_cap_slot_free(tenants: list[Any]) -> None:
    # A stopping --threads worker gives back the jobs it claimed ahead and never started.
    tenant = str(tenants[0].pk)
    runs = [dispatch("tests.capped", {"i": i}, tenant=tenant) for i in range(3)]  # cap 2
    client, keys = get_redis(), get_keys()
    claims = _claims(2)
    jobs = step(client, keys, "worker", [], claims)
    assert [JobMeta.from_json(j.meta_raw).run_id for j in jobs] == [r.run_id for r in runs[:2]]
    assert step(client, keys, "worker", [], _claims(1, "full")) == []  # the tenant is at its cap
    # Given back last claimed first (each goes to the front), as the claimer does.
    returned = [
        Finished(job.job_id, f"{job.job_id}:{claim.execution_id}", given_back(job.job_id, job.meta_raw))
        for job, claim in reversed(list(zip(jobs, claims, strict=True)))
    ]
    again = step(client, keys, "worker", returned, _claims(3, "again"))
    # Both back in front of the third, in their order; no attempt used, records untouched.
    assert [JobMeta.from_json(j.meta_raw).run_id for j in again] == [r.run_id for r in runs[:2]]
    assert [JobMeta.from_json(j.meta_raw).attempt for j in again] == [1, 1]
    assert {JobRun.objects.get(pk=r.run_id).status for r in runs} == {RunStatus.QUEUED}
    assert client.zcard(keys.started("worker")) == 2  # the two claimed again, nothing else


def test_a_step_sent_again_returns_the_claims_the_first_one_made_instead_of_claiming_more(
    redis_client: redis.Redis,
) -> None:
    """A step whose reply was lost (a timeout, a dropped connection) is sent again with
    ``again``: if the first one ran, its claims are in the started registry under the same
    execution ids, and the second returns them, doing nothing else. (Before, it claimed the next
    jobs too: the first call's stayed started with no worker, and the reaper counted an attempt
    for each that never ran.) script_calls.call sends the second call so (args_again)."""
    runs = [dispatch("tests.record", {"n": n}) for n in range(3)]
    client, keys = get_redis(), get_keys()
    script = scripts_for(client).finish_and_claim
    script_keys = [*keys.outcome_registries("worker"), keys.queue("worker")]

    def call(again: int, *executions: str) -> list[str]:
        args = FinishAndClaimArgs(
            now=time.time(), now_iso=rq_time(datetime.now(UTC)), worker="sim", deadline=time.time() + 60,
            lane_prefix=keys.lane("worker"), finished=0, claims=len(executions), counts=0, again=again,
        )  # fmt: skip
        raw = script(keys=script_keys, args=argv(args, *executions), client=client)
        if raw and raw[0] == b"again":  # found: (id, data, meta, execution) each
            assert [e.decode() for e in raw[4::4]] == list(executions)
            return [i.decode() for i in raw[1::4]]
        return [raw[i].decode() for i in range(0, len(raw), 3)]

    assert call(0, "e1", "e2") == [runs[0].job_id, runs[1].job_id]  # the first call ran
    assert call(1, "e1", "e2") == [runs[0].job_id, runs[1].job_id]  # sent again: the same jobs
    started = redis_client.zrange(keys.started("worker"), 0, -1)
    assert sorted(started) == sorted(f"{r.job_id}:e{n}".encode() for n, r in enumerate(runs[:2], 1))
    # Sent again when the first never ran: nothing under its execution id, so it claims.
    assert call(1, "e3") == [runs[2].job_id]


def test_a_step_sent_again_pairs_each_claim_it_finds_with_its_execution_id(redis_client: redis.Redis) -> None:
    """One of the first call's claims is gone by the resend (reaped, its hash deleted): the others
    keep their own execution ids, and their leases run from the resend's deadline. Paired by
    order instead, a job's lease member was another claim's, so its heartbeat and its finish
    found nothing, and the reaper ran it a second time."""
    runs = [dispatch("tests.record", {"n": n}) for n in range(3)]
    client, keys = get_redis(), get_keys()
    first = [Claim("sim", f"x{n}", time.time() + 60) for n in range(3)]
    assert [job.job_id for job in step(client, keys, "worker", [], first)] == [r.job_id for r in runs]
    client.delete(keys.job(runs[1].job_id))  # the second claim's job is gone meanwhile
    later = time.time() + 600
    again = step(
        client, keys, "worker", [], [Claim(c.worker, c.execution_id, later) for c in first], again=True
    )
    assert [(job.job_id, job.execution_id) for job in again] == [
        (runs[0].job_id, "x0"),
        (runs[2].job_id, "x2"),
    ]
    for job in again:
        assert client.zscore(keys.started("worker"), f"{job.job_id}:{job.execution_id}") == later


@pytest.mark.parametrize("first", ["push", "claim"])
def test_a_flow_key_of_another_type_is_set_aside_and_the_flow_goes_on(
    tenants: list[Any], redis_client: redis.Redis, first: str
) -> None:
    """Something wrote a string where a tenant's flow list belongs. Whether a push or a claim
    meets it first, the key is renamed aside for operators and the tenant's runs go on; before,
    every push into it counted its limit and wrote its hash, then failed (and the limit filled)."""
    from kumiko_jobs.testing import drain

    keys, acme = get_keys(), tenants[0]
    flow = f"t|{acme.pk}"
    redis_client.set(keys.flow("worker", flow), "not a list")
    if first == "claim":
        redis_client.lpush(keys.ring("worker"), flow)
        redis_client.hset(keys.flow_states("worker"), flow, "r")
        assert finish_and_claim(redis_client, keys, "worker", claim=Claim("w", "x", time.time() + 60)) is None
    runs = [dispatch("tests.limited", {"n": n}, tenant=acme) for n in range(3)]  # max_per_tenant=3
    assert [r.status for r in runs] == ["queued"] * 3
    assert drain() == {"succeeded": 3}
    assert redis_client.get(f"{keys.broken_flows('worker')}:{flow}") == b"not a list"
    assert redis_client.smembers(keys.broken_flows("worker")) == {flow.encode()}
    assert dispatch("tests.limited", {"n": 4}, tenant=acme).status == "queued"  # its limit was released


def test_a_claim_that_meets_only_dead_ring_entries_wakes_a_worker_to_look_again(
    tenants: list[Any], redis_client: redis.Redis
) -> None:
    """A bulk cancel leaves many emptied flows in the ring: one claim clears 32 of them and finds
    nothing, and the flows behind them must not wait for a worker's block timeout."""
    keys = get_keys()
    result = dispatch("tests.record", {"n": 1}, tenant=tenants[0])
    for n in range(40):  # emptied flows ahead of the one with work
        redis_client.lpush(keys.ring("worker"), f"t|gone-{n}")
        redis_client.hset(keys.flow_states("worker"), f"t|gone-{n}", "r")
    redis_client.delete(keys.wake("worker"))
    claim = Claim("w", "x", time.time() + 60)
    assert finish_and_claim(redis_client, keys, "worker", claim=claim) is None
    assert redis_client.llen(keys.wake("worker")) == 1  # an idle worker looks again at once
    job = finish_and_claim(redis_client, keys, "worker", claim=Claim("w", "y", time.time() + 60))
    assert job is not None and job.job_id == result.job_id


def test_a_replace_flow_of_another_type_is_set_aside_by_the_next_dispatch(
    tenants: list[Any], redis_client: redis.Redis
) -> None:
    """A replace push reads the flow's waiting runs before it pushes: that read met the wrong-
    typed key first and failed every dispatch of the job for that tenant, its hash written."""
    from kumiko_jobs.testing import drain

    keys, acme = get_keys(), tenants[0]
    first = dispatch("tests.replacing", {"n": 1}, tenant=acme)
    flow = redis_client.hget(keys.job(first.job_id), "kumiko_flow").decode()
    assert drain() == {"succeeded": 1}
    redis_client.set(keys.flow("worker", flow), "not a list")
    assert dispatch("tests.replacing", {"n": 2}, tenant=acme).status == "queued"
    assert drain() == {"succeeded": 1}
    assert redis_client.sismember(keys.broken_flows("worker"), flow)


def test_a_cancel_that_meets_a_flow_of_another_type_sets_it_aside_and_cancels(
    tenants: list[Any], redis_client: redis.Redis
) -> None:
    """An operator's cancel reads the run's flow to take it out: the wrong-typed key is set
    aside there too, and the run is canceled rather than the cancel failing."""
    from kumiko_jobs.cancelling import cancel_queued

    keys = get_keys()
    run = dispatch("tests.limited", {"n": 1}, tenant=tenants[0])
    flow = redis_client.hget(keys.job(run.job_id), "kumiko_flow").decode()
    redis_client.set(keys.flow("worker", flow), "not a list")
    assert cancel_queued([run.job_id]).canceled == (run.job_id,)
    assert redis_client.sismember(keys.broken_flows("worker"), flow)
    assert dispatch("tests.limited", {"n": 2}, tenant=tenants[0]).status == "queued"
