"""Tenancy on the enqueue side: ``max_per_tenant`` under a deep queue, and per-tenant fan-out.

Both run in the bench process, no worker: ``dispatch()`` through a limit counter in a hash that
also holds 1,000 other tenants' counters, and ``run_fan_out`` of a per-tenant wrapper to 10,000
tenants against RQ's ``enqueue_many`` of as many jobs. bench/tenancy.py runs them after the
worker-side parts; BENCHMARKS.md says what each figure means.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

from rq import Queue
from rq.serializers import JSONSerializer

from bench.benchapp.tenants import FANOUT_TENANTS_ENV
from bench.environment import BenchEnv, BenchError, reset
from bench.filling import fill
from bench.results import Figure, rounds_range
from bench.rqtasks import noop

FANOUT_RAW_BATCH = 1000
WARM_UP = 20
LIMIT = 1000  # bench.limited's max_per_tenant
DEEP_QUEUE_TARGET = 1.2  # time per dispatch with the deep queue / empty lane, at most
FANOUT_TARGET = 0.8  # fan-out children/s / enqueue_many jobs/s, at least


def check_dispatch_budget(dispatches: int, rounds: int) -> None:
    """Every measured dispatch must be queued: all of them together stay under the limit."""
    if WARM_UP + rounds * dispatches >= LIMIT:
        raise BenchError(f"{rounds} x {dispatches} dispatches reach bench.limited's limit")


def deep_queue_dispatch(
    env: BenchEnv,
    tenant: str,
    *,
    dispatches: int,
    rounds: int,
    deep_queue: int,
    deep_tenants: int,
    deep_rows: bool,
) -> list[Figure]:
    """dispatch() of a job with max_per_tenant=1000 (skip) for one tenant, on an empty lane and
    on a lane that holds a deep queue of other tenants' runs of such a job (their limit counters
    in the same hash). bench.limited_api (api lane, kept empty) and bench.limited (worker lane,
    the deep queue) alternate round by round in one process and one Redis state, so a burst of
    load from a neighbour hits both sides alike. Rounds on an empty Redis before the deep queue is
    pushed show what its 100,000 job hashes in the keyspace cost on their own."""
    check_dispatch_budget(dispatches, rounds)
    per_tenant = deep_queue // deep_tenants
    before = _dispatch_rounds("bench.limited", tenant, dispatches, max(rounds // 2, 1))
    reset(env)
    started = time.perf_counter()
    runs = (f"deep{t}" for t in range(deep_tenants) for _ in range(per_tenant))
    fill(env.prefix, "bench.limited", list(runs), tag="deep", rows=deep_rows)
    fill_seconds = time.perf_counter() - started
    empty: list[float] = []
    deep: list[float] = []
    _dispatch_rounds("bench.limited_api", tenant, 0, 0)
    _dispatch_rounds("bench.limited", tenant, 0, 0)
    for number in range(rounds):
        sides = [(empty, "bench.limited_api"), (deep, "bench.limited")]
        for seconds, name in sides if number % 2 == 0 else sides[::-1]:
            seconds += _dispatch_rounds(name, tenant, dispatches, 1, warm_up=False)
    reset(env)
    per_before = statistics.median(before) / dispatches
    per_empty = statistics.median(empty) / dispatches
    per_deep = statistics.median(deep) / dispatches
    rows = "with their JobRun rows" if deep_rows else "Redis only, no JobRun rows"
    described = f"rounds of {dispatches} dispatches alternating with the other lane's"
    return [
        Figure(
            "dispatch() max_per_tenant=1000, empty lane",
            f"{1 / per_empty:,.0f}/s ({per_empty * 1000:.2f} ms)",
            how=f"api lane, kept empty; {described}, median of {len(empty)}"
            f"{rounds_range(empty, dispatches)}; "
            f"before the deep queue existed: {1 / per_before:,.0f}/s ({per_before * 1000:.2f} ms)",
        ),
        Figure(
            f"dispatch() max_per_tenant=1000, {deep_queue:,} runs of other tenants queued",
            f"{1 / per_deep:,.0f}/s ({per_deep * 1000:.2f} ms)",
            how=f"worker lane: {deep_tenants:,} tenants x {per_tenant} runs of the same kind, {rows}, "
            f"pushed in {fill_seconds:.1f}s; {described}, median of {len(deep)}"
            f"{rounds_range(deep, dispatches)}",
        ),
        Figure(
            "time per dispatch: deep queue / empty lane",
            f"{per_deep / per_empty:.2f}",
            f"<= {DEEP_QUEUE_TARGET:g}",
            per_deep / per_empty <= DEEP_QUEUE_TARGET,
            f"one Lua call (limit counter + flow push) + one JobRun INSERT each; deep queue / empty Redis "
            f"before it: {per_deep / per_before:.2f}",
        ),
    ]


def _dispatch_rounds(name: str, tenant: str, count: int, rounds: int, *, warm_up: bool = True) -> list[float]:
    """Seconds per round of ``count`` dispatches, after a warm-up (connection, tenant cache)."""
    from django.db import connection

    from kumiko_jobs import dispatch

    if connection.in_atomic_block:
        raise BenchError("dispatch must be measured outside a transaction")
    for i in range(WARM_UP if warm_up else 0):
        dispatch(name, {"warm": i}, tenant=tenant)
    seconds: list[float] = []
    for _ in range(rounds):
        started = time.perf_counter()
        results = [dispatch(name, {"i": i}, tenant=tenant) for i in range(count)]
        seconds.append(time.perf_counter() - started)
        refused = [r for r in results if r.status != "queued"]
        if refused:
            raise BenchError(f"{len(refused)} of the measured dispatches were not queued, e.g. {refused[0]}")
    return seconds


def fan_out(env: BenchEnv, tenants: int, rounds: int) -> list[Figure]:
    ours: list[float] = []
    raw: list[float] = []
    for number in range(rounds):
        sides: list[tuple[list[float], Callable[[], float]]] = [
            (ours, functools.partial(_fan_out_once, env, tenants)),
            (raw, functools.partial(_enqueue_many_once, env, tenants, f"fanraw{number}")),
        ]
        for seconds, run in sides if number % 2 == 0 else sides[::-1]:
            seconds.append(run())
            reset(env)
    ours_rate = tenants / statistics.median(ours)
    raw_rate = tenants / statistics.median(raw)
    median = f"median of {rounds}, " if rounds > 1 else ""
    return [
        Figure(
            f"fan-out to {tenants:,} tenants (run_fan_out)",
            f"{ours_rate:,.0f} children/s",
            how=f"{median}a wrapper dispatched and its fan-out run in this process: per 1,000 tenants "
            "a SELECT of existing child ids, prepare() each, the push, the INSERT of their JobRun rows"
            f"{rounds_range(ours, tenants)}",
        ),
        Figure(
            f"rq Queue.enqueue_many, {tenants:,} jobs",
            f"{raw_rate:,.0f} jobs/s",
            how=f"{median}JSON serializer, pipelined batches of {FANOUT_RAW_BATCH:,}, no database"
            f"{rounds_range(raw, tenants)}",
        ),
        Figure(
            "fan-out / enqueue_many",
            f"{ours_rate / raw_rate:.2f}",
            f">= {FANOUT_TARGET:g}",
            ours_rate / raw_rate >= FANOUT_TARGET,
            "ours also records a JobRun row per child",
        ),
    ]


def _fan_out_once(env: BenchEnv, tenants: int) -> float:
    """Dispatch a bench.fanned wrapper and run its fan-out here, as a worker would."""
    from kumiko_jobs import dispatch
    from kumiko_jobs.attempt_records import Started
    from kumiko_jobs.connection import get_keys, get_redis
    from kumiko_jobs.fanout import run_fan_out
    from kumiko_jobs.jobdata import JobMeta
    from kumiko_jobs.models import JobRun

    wrapper = dispatch("bench.fanned", {})
    if wrapper.job_id is None:
        raise BenchError(f"the fan-out wrapper was not queued: {wrapper}")
    raw_meta = get_redis().hget(get_keys().job(wrapper.job_id), "meta")
    if raw_meta is None:
        raise BenchError(f"the fan-out wrapper {wrapper.job_id} has no job hash")
    meta = JobMeta.from_json(raw_meta)
    os.environ[FANOUT_TENANTS_ENV] = str(tenants)
    try:
        started = time.perf_counter()
        start = Started(str(wrapper.job_id), {}, f"{env.prefix}_fanout", datetime.now(UTC))
        outcome = run_fan_out(meta, start, "bench.fanned")
        seconds = time.perf_counter() - started
    finally:
        del os.environ[FANOUT_TENANTS_ENV]
    children = JobRun.objects.filter(job_id__startswith=f"{wrapper.job_id}-t-").count()
    if outcome.kind != "ok" or children != tenants:
        raise BenchError(f"fan-out ended {outcome.kind} with {children} of {tenants} child rows")
    return seconds


def _enqueue_many_once(env: BenchEnv, count: int, tag: str) -> float:
    from kumiko_jobs.connection import get_redis

    client = get_redis()
    queue = Queue(f"{env.prefix}_{tag}", connection=client, serializer=JSONSerializer)
    started = time.perf_counter()
    for start in range(0, count, FANOUT_RAW_BATCH):
        size = min(FANOUT_RAW_BATCH, count - start)
        with client.pipeline() as pipe:
            queue.enqueue_many(
                [
                    Queue.prepare_data(noop, (start + n,), job_id=f"{env.prefix}_{tag}_{start + n}")
                    for n in range(size)
                ],
                pipeline=pipe,
            )
            pipe.execute()
    return time.perf_counter() - started
