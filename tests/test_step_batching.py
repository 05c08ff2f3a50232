"""The lane steps of several job threads in one script call (lane.step, step_batching.py) and
the leader/follower combining under them (combining.py), on real Redis and real threads."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from kumiko_jobs import dispatch
from kumiko_jobs.combining import Combiner
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.lane import Claim, ClaimedJob, Finished, finish_and_claim, step
from kumiko_jobs.outcomes import Outcome, Release
from kumiko_jobs.step_batching import StepBatcher

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


def test_batcher_gives_each_thread_its_own_claim_and_finishes_theirs(tenants: list[Any]) -> None:
    tenant = str(tenants[0].pk)
    for n in range(40):
        dispatch("tests.record", {"n": n}, tenant=tenant)
    client, keys = get_redis(), get_keys()
    batcher = StepBatcher(client, keys, "worker")
    ran: dict[int, list[str]] = {}
    steps: dict[int, int] = {}
    errors: list[BaseException] = []

    def thread(number: int) -> None:
        finished: Finished | None = None
        mine: list[str] = []
        steps[number] = 1  # the last one, below
        try:
            for turn in range(10):
                claim = Claim("sim", f"t{number}-{turn}", time.time() + 60)
                steps[number] += 1
                job = batcher.finish_and_claim(finished, claim)
                finished = None
                if job is None:
                    break
                mine.append(job.job_id)
                finished = _finished(job, claim.execution_id)
            batcher.finish_and_claim(finished, None)
        except BaseException as exc:
            errors.append(exc)
        ran[number] = mine

    threads = [threading.Thread(target=thread, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    claimed = [job_id for jobs in ran.values() for job_id in jobs]
    assert len(claimed) == len(set(claimed)) == 40  # every run once, to one thread
    assert client.zcard(keys.started("worker")) == 0  # every claim finished by its holder
    assert batcher.requests == sum(steps.values())
    assert 0 < batcher.calls <= batcher.requests


def test_a_failed_call_fails_every_step_of_its_batch_and_keeps_the_finished_attempt(
    tenants: list[Any],
) -> None:
    dispatch("tests.record", {}, tenant=str(tenants[0].pk))
    client, keys = get_redis(), get_keys()
    claim = _claims(1)[0]
    job = finish_and_claim(client, keys, "worker", claim=claim)
    assert job is not None
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    batcher = StepBatcher(dead, keys, "worker")
    with pytest.raises(redis.ConnectionError):
        batcher.finish_and_claim(_finished(job, claim.execution_id), _claims(1, "x")[0])
    # Nothing reached Redis: the lease is still held, and a retry on a live client finishes it.
    assert client.zscore(keys.started("worker"), f"{job.job_id}:{claim.execution_id}") is not None
    assert (
        StepBatcher(client, keys, "worker").finish_and_claim(_finished(job, claim.execution_id), None) is None
    )
    assert client.zcard(keys.started("worker")) == 0


class _Gate:
    """A send for Combiner that holds its first call until ``waiting`` threads have submitted."""

    def __init__(self, waiting: int) -> None:
        self.waiting = waiting
        self.submitted = 0
        self.lock = threading.Lock()
        self.batches: list[list[int]] = []

    def count(self) -> None:
        with self.lock:
            self.submitted += 1

    def send(self, requests: Sequence[int]) -> list[int | BaseException]:
        if not self.batches:
            deadline = time.monotonic() + 10
            while self.submitted < self.waiting and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.2)  # the last ones counted are queued by now
        self.batches.append(list(requests))
        return [ValueError(f"bad {r}") if r == 3 else r * 10 for r in requests]


def test_combiner_sends_what_queued_meanwhile_in_one_call() -> None:
    gate = _Gate(waiting=8)
    combiner: Combiner[int, int] = Combiner(gate.send)
    results: dict[int, object] = {}

    def submit(request: int) -> None:
        gate.count()
        try:
            results[request] = combiner.submit(request)
        except ValueError as exc:
            results[request] = exc

    first = threading.Thread(target=submit, args=(0,))
    first.start()
    time.sleep(0.05)  # 0 leads, and its call waits for the others
    others = [threading.Thread(target=submit, args=(n,)) for n in range(1, 8)]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join(15)
        assert not t.is_alive()
    assert gate.batches[0] == [0]
    assert sorted(gate.batches[1]) == list(range(1, 8))  # all seven in the next call
    assert (combiner.calls, combiner.requests) == (2, 8)
    # Each thread its own result; the one failed request's error in its own thread only.
    assert {r: v for r, v in results.items() if r != 3} == {r: r * 10 for r in range(8) if r != 3}
    assert str(results[3]) == "bad 3"


def test_combiner_error_of_the_call_reaches_every_thread_and_nobody_hangs() -> None:
    calls = 0

    def send(requests: Sequence[int]) -> list[int]:
        nonlocal calls
        calls += 1
        time.sleep(0.05)
        if calls == 1:
            raise OSError("server gone")
        return [r + 1 for r in requests]

    combiner: Combiner[int, int] = Combiner(send)
    outcomes: dict[int, object] = {}

    def submit(request: int) -> None:
        try:
            outcomes[request] = combiner.submit(request)
        except OSError as exc:
            outcomes[request] = exc

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
        time.sleep(0.01)
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    assert isinstance(outcomes[0], OSError)  # the first call, alone in it
    assert all(outcomes[n] == n + 1 for n in range(1, 6))  # the next call carried the rest
    # A result list of the wrong length is every request's error, not a hang.
    short: Combiner[int, int] = Combiner(lambda requests: [])
    with pytest.raises(RuntimeError, match="0 results for 1 requests"):
        short.submit(1)
