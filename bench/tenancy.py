"""Tenancy at scale: a quiet tenant behind a noisy one and behind 1,000 busy ones, what fairness
costs a worker, ``max_per_tenant`` under a deep queue, and per-tenant fan-out.

Backlogs are pushed the fast way, as tests/test_gates.py does: ``prepare()`` and ``push()`` in
pipelined batches of 500, rows through ``records.insert_queued`` first (as inside a
transaction), split over one forked process per core. The runs that are measured go through
``dispatch()`` (or ``run_fan_out``). Worker children are ``manage.py runjobs --lane worker``
with the bench settings, as in bench/worker_rate.py. Each part stops its workers and deletes
the bench's keys and rows before the next one, so each starts on an empty lane. See
BENCHMARKS.md for what each figure means.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import islice
from typing import TypeVar

import redis
from rich.console import Console
from rq import Queue
from rq.serializers import JSONSerializer
from rq.utils import utcparse

from bench.benchapp.tenants import FANOUT_TENANTS_ENV
from bench.children import Child, running
from bench.environment import BenchEnv, BenchError, delete_own_keys, delete_own_rows
from bench.results import Figure
from bench.rqtasks import noop
from bench.worker_rate import RUNJOBS, fill_rq_queue, recorded_busy_seconds

T = TypeVar("T")

PUSH_BATCH = 500
FANOUT_RAW_BATCH = 1000
# A worker that keeps running (the quiet tenant's run is dispatched while it works).
RUNJOBS_SERVING = tuple(arg for arg in RUNJOBS if arg != "--burst")
WARM_UP = 20
LIMIT = 1000  # bench.limited's max_per_tenant
LATENCY_TARGET = 1.0  # seconds
FAIRNESS_TARGET = 0.9  # 1,000-tenant rate / 1-tenant rate, at least
DEEP_QUEUE_TARGET = 1.2  # time per dispatch with the deep queue / empty lane, at most
FANOUT_TARGET = 0.8  # fan-out children/s / enqueue_many jobs/s, at least


@dataclass(frozen=True)
class Sizes:
    backlog: int  # the noisy tenant's queued runs (and the FIFO baseline's jobs)
    head_start: int  # runs finished before the quiet tenant dispatches
    quiet_samples: int  # the quiet tenant's runs, dispatched one at a time
    busy_tenants: int
    busy_runs: int  # queued runs per busy tenant
    fair_jobs: int
    fair_tenants: int
    fair_rounds: int
    dispatches: int  # per round of max_per_tenant dispatches
    dispatch_rounds: int  # per lane (empty, deep) alternating; half as many before the deep queue
    deep_queue: int
    deep_tenants: int
    deep_rows: bool  # insert the deep queue's JobRun rows too
    fanout: int
    fanout_rounds: int
    fifo_window: float  # seconds the FIFO baseline is watched before its latency is estimated


FULL = Sizes(
    backlog=20_000,
    head_start=100,
    quiet_samples=5,
    busy_tenants=1000,
    busy_runs=20,
    fair_jobs=3000,
    fair_tenants=1000,
    fair_rounds=2,
    dispatches=150,
    dispatch_rounds=6,
    deep_queue=100_000,
    deep_tenants=1000,
    # Redis only: the rows would double the fill time (BENCHMARKS.md has a one-off run with them).
    deep_rows=False,
    fanout=10_000,
    fanout_rounds=1,  # far from its target in every run so far; a second round costs ~5 s
    fifo_window=2.0,
)
QUICK = Sizes(
    backlog=1000,
    head_start=20,
    quiet_samples=2,
    busy_tenants=50,
    busy_runs=5,
    fair_jobs=200,
    fair_tenants=50,
    fair_rounds=1,
    dispatches=50,
    dispatch_rounds=2,
    deep_queue=2000,
    deep_tenants=50,
    deep_rows=True,
    fanout=500,
    fanout_rounds=1,
    fifo_window=1.0,
)


def measure_tenancy(env: BenchEnv, sizes: Sizes, console: Console) -> list[Figure]:
    if WARM_UP + sizes.dispatch_rounds * sizes.dispatches >= LIMIT:
        raise BenchError(
            f"{sizes.dispatch_rounds} x {sizes.dispatches} dispatches reach bench.limited's limit"
        )
    noisy, quiet = _two_tenants()
    reset(env)  # earlier sections leave queued jobs behind; every part starts on an empty lane
    figures: list[Figure] = []
    console.log(f"tenancy: quiet tenant behind {sizes.backlog:,} runs of one tenant (runjobs, then rq FIFO)")
    figures += noisy_neighbour(env, sizes, noisy, quiet)
    console.log(f"tenancy: quiet tenant behind {sizes.busy_tenants:,} tenants x {sizes.busy_runs}")
    figures += busy_tenants(env, sizes, quiet)
    console.log(f"tenancy: {sizes.fair_jobs:,} trivial jobs of 1 tenant vs {sizes.fair_tenants:,} tenants")
    figures += fairness_cost(env, sizes, noisy)
    console.log(f"tenancy: dispatch() with max_per_tenant, empty lane vs {sizes.deep_queue:,} queued")
    figures += deep_queue_dispatch(env, sizes, quiet)
    console.log(f"tenancy: fan-out to {sizes.fanout:,} tenants vs rq enqueue_many")
    figures += fan_out(env, sizes)
    return figures


# Parts -------------------------------------------------------------------------------------


def noisy_neighbour(env: BenchEnv, sizes: Sizes, noisy: str, quiet: str) -> list[Figure]:
    backlog = fill(env.prefix, "bench.noop", [noisy] * sizes.backlog, tag="noisy")
    ours = quiet_start(env, sizes.head_start, sizes.quiet_samples, quiet, backlog)
    reset(env)
    fifo = fifo_baseline(env, sizes)
    reset(env)
    label = f"quiet tenant's start behind {sizes.backlog:,} runs of one tenant (runjobs)"
    return [ours.figure(label, "A's"), fifo]


def busy_tenants(env: BenchEnv, sizes: Sizes, quiet: str) -> list[Figure]:
    tenants = [f"busy{t}" for t in range(sizes.busy_tenants)]
    runs = [tenant for tenant in tenants for _ in range(sizes.busy_runs)]
    backlog = fill(env.prefix, "bench.noop", runs, tag="busy")
    ours = quiet_start(env, sizes.head_start, sizes.quiet_samples, quiet, backlog)
    reset(env)
    label = f"quiet tenant's start behind {sizes.busy_tenants:,} tenants x {sizes.busy_runs} runs (runjobs)"
    return [ours.figure(label, "the busy tenants'")]


def fairness_cost(env: BenchEnv, sizes: Sizes, single: str) -> list[Figure]:
    """The same worker process runs every set: it is paused (SIGSTOP) while a set is pushed and
    resumed to work it off, so both sides share its start-up, caches and connections."""
    from kumiko_jobs.connection import get_keys, get_redis

    spread = [f"fair{t}" for t in range(sizes.fair_tenants)]
    one: list[float] = []
    many: list[float] = []
    client = get_redis()
    with running(env, RUNJOBS_SERVING) as worker:
        claimers = get_keys().claimers("worker")
        worker.wait_for(lambda: client.scard(claimers) > 0, 60, "the worker to join the lane")
        for number in range(sizes.fair_rounds):
            # The 1,000-tenant side first, in ABBA order over two rounds: single sets here differ
            # by ~10 %, and the first after the earlier parts tends to be the slowest.
            sides = [(many, spread), (one, [single])]
            for seconds, tenants in sides if number % 2 == 0 else sides[::-1]:
                tag = f"fair{len(tenants)}_{number}"
                seconds.append(_work_off(env, worker, tenants, sizes.fair_jobs, tag))
    reset(env)
    one_rate = sizes.fair_jobs / statistics.median(one)
    many_rate = sizes.fair_jobs / statistics.median(many)
    per_tenant = sizes.fair_jobs // sizes.fair_tenants
    rounds = f"median of {sizes.fair_rounds}; " if sizes.fair_rounds > 1 else ""
    how = (
        "one serving runjobs process for all sets, paused while each set is pushed; rate from the job hashes"
    )
    return [
        Figure(
            f"runjobs, {sizes.fair_jobs:,} trivial jobs of 1 tenant",
            f"{one_rate:,.0f} jobs/s",
            how=f"{rounds}{how}{_range(one, sizes.fair_jobs)}",
        ),
        Figure(
            f"runjobs, {sizes.fair_jobs:,} trivial jobs of {sizes.fair_tenants:,} tenants x {per_tenant}",
            f"{many_rate:,.0f} jobs/s",
            how=f"{rounds}same worker{_range(many, sizes.fair_jobs)}",
        ),
        Figure(
            f"fairness cost: {sizes.fair_tenants:,}-tenant rate / 1-tenant rate",
            f"{many_rate / one_rate:.2f}",
            f">= {FAIRNESS_TARGET:g}",
            many_rate / one_rate >= FAIRNESS_TARGET,
            f"one set each, the {sizes.fair_tenants:,}-tenant side first"
            if sizes.fair_rounds == 1
            else f"{sizes.fair_rounds} sets each in ABBA order, the {sizes.fair_tenants:,}-tenant side first",
        ),
    ]


def deep_queue_dispatch(env: BenchEnv, sizes: Sizes, tenant: str) -> list[Figure]:
    """dispatch() of a job with max_per_tenant=1000 (skip) for one tenant, on an empty lane and
    on a lane that holds a deep queue of other tenants' runs of such a job (their limit counters
    in the same hash). bench.limited_api (api lane, kept empty) and bench.limited (worker lane,
    the deep queue) alternate round by round in one process and one Redis state, so a burst of
    load from a neighbour hits both sides alike. Rounds on an empty Redis before the deep queue is
    pushed show what its 100,000 job hashes in the keyspace cost on their own."""
    per_tenant = sizes.deep_queue // sizes.deep_tenants
    before = _dispatch_rounds("bench.limited", tenant, sizes.dispatches, max(sizes.dispatch_rounds // 2, 1))
    reset(env)
    started = time.perf_counter()
    runs = (f"deep{t}" for t in range(sizes.deep_tenants) for _ in range(per_tenant))
    fill(env.prefix, "bench.limited", list(runs), tag="deep", rows=sizes.deep_rows)
    fill_seconds = time.perf_counter() - started
    empty: list[float] = []
    deep: list[float] = []
    _dispatch_rounds("bench.limited_api", tenant, 0, 0)
    _dispatch_rounds("bench.limited", tenant, 0, 0)
    for number in range(sizes.dispatch_rounds):
        sides = [(empty, "bench.limited_api"), (deep, "bench.limited")]
        for seconds, name in sides if number % 2 == 0 else sides[::-1]:
            seconds += _dispatch_rounds(name, tenant, sizes.dispatches, 1, warm_up=False)
    reset(env)
    per_before = statistics.median(before) / sizes.dispatches
    per_empty = statistics.median(empty) / sizes.dispatches
    per_deep = statistics.median(deep) / sizes.dispatches
    rows = "with their JobRun rows" if sizes.deep_rows else "Redis only, no JobRun rows"
    rounds = f"rounds of {sizes.dispatches} dispatches alternating with the other lane's"
    return [
        Figure(
            "dispatch() max_per_tenant=1000, empty lane",
            f"{1 / per_empty:,.0f}/s ({per_empty * 1000:.2f} ms)",
            how=f"api lane, kept empty; {rounds}, median of {len(empty)}{_range(empty, sizes.dispatches)}; "
            f"before the deep queue existed: {1 / per_before:,.0f}/s ({per_before * 1000:.2f} ms)",
        ),
        Figure(
            f"dispatch() max_per_tenant=1000, {sizes.deep_queue:,} runs of other tenants queued",
            f"{1 / per_deep:,.0f}/s ({per_deep * 1000:.2f} ms)",
            how=f"worker lane: {sizes.deep_tenants:,} tenants x {per_tenant} runs of the same kind, {rows}, "
            f"pushed in {fill_seconds:.1f}s; {rounds}, median of {len(deep)}"
            f"{_range(deep, sizes.dispatches)}",
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


def fan_out(env: BenchEnv, sizes: Sizes) -> list[Figure]:
    ours: list[float] = []
    raw: list[float] = []
    for number in range(sizes.fanout_rounds):
        sides: list[tuple[list[float], Callable[[], float]]] = [
            (ours, lambda: _fan_out_once(env, sizes.fanout)),
            (raw, lambda tag=f"fanraw{number}": _enqueue_many_once(env, sizes.fanout, tag)),
        ]
        for seconds, run in sides if number % 2 == 0 else sides[::-1]:
            seconds.append(run())
            reset(env)
    ours_rate = sizes.fanout / statistics.median(ours)
    raw_rate = sizes.fanout / statistics.median(raw)
    rounds = f"median of {sizes.fanout_rounds}, " if sizes.fanout_rounds > 1 else ""
    return [
        Figure(
            f"fan-out to {sizes.fanout:,} tenants (run_fan_out)",
            f"{ours_rate:,.0f} children/s",
            how=f"{rounds}a wrapper dispatched and its fan-out run in this process: per 1,000 tenants "
            "a SELECT of existing child ids, prepare() each, the push, the INSERT of their JobRun rows"
            f"{_range(ours, sizes.fanout)}",
        ),
        Figure(
            f"rq Queue.enqueue_many, {sizes.fanout:,} jobs",
            f"{raw_rate:,.0f} jobs/s",
            how=f"{rounds}JSON serializer, pipelined batches of {FANOUT_RAW_BATCH:,}, no database"
            f"{_range(raw, sizes.fanout)}",
        ),
        Figure(
            "fan-out / enqueue_many",
            f"{ours_rate / raw_rate:.2f}",
            f">= {FANOUT_TARGET:g}",
            ours_rate / raw_rate >= FANOUT_TARGET,
            "ours also records a JobRun row per child",
        ),
    ]


# Quiet tenant --------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuietStart:
    """The quiet tenant's runs, dispatched one after the other once the backlog is being worked."""

    latencies: list[float]  # each run's started_at - the moment its dispatch() was called
    dispatch_seconds: list[float]  # how long each dispatch() call took
    between: list[int]  # backlog runs started after each dispatch() was called, before that run
    finished_before: int  # backlog runs finished when the first was dispatched
    waiting: int  # backlog runs not started when the last one started

    def figure(self, label: str, backlog: str) -> Figure:
        worst = max(self.latencies)
        return Figure(
            label,
            f"{_ms(statistics.median(self.latencies))} (max {_ms(worst)})",
            f"<= {LATENCY_TARGET:g} s",
            worst <= LATENCY_TARGET,
            f"median (max) of {len(self.latencies)} runs of B dispatched one at a time, the first after "
            f"{self.finished_before:,} of {backlog} runs had finished; {self.waiting:,} still queued at "
            f"the end; {backlog} runs started between a dispatch and B's start: "
            f"{', '.join(map(str, self.between))}; dispatch() call median "
            f"{_ms(statistics.median(self.dispatch_seconds))}, max {_ms(max(self.dispatch_seconds))}",
        )


def quiet_start(
    env: BenchEnv, head_start: int, samples: int, quiet: str, backlog: Sequence[str]
) -> QuietStart:
    """Start a worker on the backlog; once ``head_start`` runs finished, dispatch a run of the
    quiet tenant, read when the worker started it from its job hash, and repeat ``samples``
    times. Each run finds the quiet tenant idle again (its flow empty), as a first one does."""
    from kumiko_jobs import dispatch

    spans: list[tuple[float, float]] = []
    calls: list[float] = []
    with running(env, RUNJOBS_SERVING) as worker:
        worker.wait_for(lambda: succeeded_runs() >= head_start, 60, f"{head_start} runs to finish")
        finished_before = succeeded_runs()
        for n in range(samples):
            dispatched_at = time.time()
            result = dispatch("bench.noop", {"quiet": n}, tenant=quiet)
            calls.append(time.time() - dispatched_at)
            if result.job_id is None:
                raise BenchError(f"the quiet tenant's dispatch was not queued: {result}")
            job_id = result.job_id
            started = worker.wait_for(
                lambda job_id=job_id: recorded_start(job_id), 30, "the quiet tenant's run to start"
            )
            spans.append((dispatched_at, started))
            time.sleep(0.05)  # B's run ends; the next dispatch finds B idle
    starts = recorded_starts(backlog)
    last = spans[-1][1]
    return QuietStart(
        latencies=[started - dispatched for dispatched, started in spans],
        dispatch_seconds=calls,
        between=[sum(1 for s in starts if dispatched <= s < started) for dispatched, started in spans],
        finished_before=finished_before,
        waiting=len(backlog) - sum(1 for s in starts if s <= last),
    )


def fifo_baseline(env: BenchEnv, sizes: Sizes) -> Figure:
    """Stock RQ: one FIFO list. B's job goes behind every queued job of A; rather than wait for
    all of them, watch B move up for ``fifo_window`` seconds and extrapolate."""
    from kumiko_jobs.connection import get_redis

    client = get_redis()
    name = f"{env.prefix}_fifo"
    fill_rq_queue(client, name, sizes.backlog)
    queue = Queue(name, connection=client, serializer=JSONSerializer)
    finished = f"rq:finished:{name}"
    quiet_id = f"{name}_quiet"
    with running(env, ("-m", "bench.rqworker", "simple", name, f"{name}_worker")) as worker:
        worker.wait_for(lambda: client.zcard(finished) >= sizes.head_start, 60, "the FIFO head start")
        finished_before = int(client.zcard(finished))
        dispatched_at = time.time()
        queue.enqueue(noop, -1, job_id=quiet_id)
        ahead = client.lpos(queue.key, quiet_id)
        positioned = time.time()
        started = None
        while started is None and time.time() < dispatched_at + sizes.fifo_window:
            worker.check()
            time.sleep(0.05)
            started = started_at(client, quiet_id)
        left = client.lpos(queue.key, quiet_id)
        watched = time.time() - positioned
        started = started or started_at(client, quiet_id)
    label = f"quiet tenant's start behind {sizes.backlog:,} jobs of one tenant (rq SimpleWorker, FIFO)"
    if ahead is None:
        raise BenchError("the FIFO baseline's quiet job left the queue before its position was read")
    ran_first = (
        f"B enqueued after {finished_before:,} of A's jobs finished, behind {ahead:,} queued ones: "
        f"all {sizes.backlog:,} of A's jobs run before B"
    )
    if started is not None:
        latency = started - dispatched_at
        return Figure(label, _ms(latency), "", None, f"measured; {ran_first}")
    if left is None:
        raise BenchError("the FIFO baseline's quiet job left the queue but did not start")
    per_job = watched / max(ahead - left, 1)
    estimate = (positioned - dispatched_at) + ahead * per_job
    return Figure(
        label,
        f"~{estimate:,.0f} s (estimated)",
        "",
        None,
        f"{ran_first}; estimate = position x {per_job * 1000:.2f} ms/job ({1 / per_job:,.0f} jobs/s), "
        f"the rate B moved up at while watched for {watched:.1f}s (B did not start)",
    )


# Fairness cost --------------------------------------------------------------------------------


def _work_off(env: BenchEnv, worker: Child, tenants: Sequence[str], count: int, tag: str) -> float:
    """Push ``count`` runs spread over ``tenants`` while the worker is paused, let it work them
    off, and return first start to last end from their job hashes."""

    done_before = succeeded_runs()
    runs = [tenants[i % len(tenants)] for i in range(count)]
    worker.process.send_signal(signal.SIGSTOP)
    try:
        job_ids = fill(env.prefix, "bench.noop", runs, tag=tag)
    finally:
        worker.process.send_signal(signal.SIGCONT)
    worker.wait_for(lambda: succeeded_runs() >= done_before + count, 60 + count / 20, f"{tag} to finish")
    return recorded_busy_seconds(f"{env.prefix}_{tag}", len(job_ids))


# max_per_tenant under a deep queue ----------------------------------------------------------


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


# Fan-out --------------------------------------------------------------------------------------


def _fan_out_once(env: BenchEnv, tenants: int) -> float:
    """Dispatch a bench.fanned wrapper and run its fan-out here, as a worker would."""
    from kumiko_jobs import dispatch
    from kumiko_jobs.connection import get_keys, get_redis
    from kumiko_jobs.fanout import run_fan_out
    from kumiko_jobs.jobdata import JobMeta
    from kumiko_jobs.models import JobRun
    from kumiko_jobs.records import Started

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


# Helpers --------------------------------------------------------------------------------------


def push_runs(prefix: str, name: str, tenants: Iterable[str], *, tag: str, rows: bool = True) -> list[str]:
    """Queue one run of job ``name`` per item of ``tenants``: prepare() and push() in pipelined
    batches, rows inserted first (as dispatch() inside a transaction does)."""
    from kumiko_jobs import records
    from kumiko_jobs.dispatching import prepare
    from kumiko_jobs.pushing import push
    from kumiko_jobs.registry import registry

    definition = registry.get(name)
    correlation_id = f"{prefix}_{tag}"
    job_ids: list[str] = []
    numbered = enumerate(tenants)
    while batch := list(islice(numbered, PUSH_BATCH)):
        prepared = [
            prepare(definition, {"n": n}, tenant_id=tenant, user_id=None, correlation_id=correlation_id)
            for n, tenant in batch
        ]
        if rows:
            records.insert_queued([p.row for p in prepared])
        refused = [o for o in push(prepared) if o.status != "queued"]
        if refused:
            raise BenchError(f"{len(refused)} backlog runs were not queued, e.g. {refused[0]}")
        job_ids += [p.job_id for p in prepared]
    return job_ids


def fill(prefix: str, name: str, tenants: Sequence[str], *, tag: str, rows: bool = True) -> list[str]:
    """push_runs() split over one forked process per core (at most 4): prepare() + push() is
    Python-bound (~0.16 ms a run, ~0.25 ms with its row), and the backlogs are 20,000-100,000 runs.
    Runs of one tenant land in its flow in the order the processes push them."""
    from django.db import connections

    processes = min(os.cpu_count() or 1, 4)
    if processes < 2 or len(tenants) < 4 * PUSH_BATCH:
        return push_runs(prefix, name, tenants, tag=tag, rows=rows)
    connections.close_all()  # the children must not share this process's database connection
    shares = [tenants[i::processes] for i in range(processes)]
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        pushed = pool.map(functools.partial(_push_share, prefix, name, tag, rows), shares)
    connections["default"].ensure_connection()  # not in the first measured dispatch()
    return [job_id for share in pushed for job_id in share]


def _push_share(prefix: str, name: str, tag: str, rows: bool, tenants: Sequence[str]) -> list[str]:
    from django.db import connections

    try:
        return push_runs(prefix, name, tenants, tag=tag, rows=rows)
    finally:
        connections.close_all()  # before the pool ends this process


def reset(env: BenchEnv) -> None:
    """Back to an empty lane: every key and run row of the bench goes (workers are stopped)."""
    delete_own_keys(env.client, env.prefix)
    delete_own_rows(env.prefix)


def succeeded_runs() -> int:
    from kumiko_jobs.models import JobRun, RunStatus

    return JobRun.objects.filter(status=RunStatus.SUCCEEDED).count()


def recorded_start(job_id: str) -> float | None:
    """When kumiko started a run, from its record (a succeeded job's hash is gone at once)."""
    from kumiko_jobs.models import JobRun

    started = JobRun.objects.filter(job_id=job_id).values_list("started_at", flat=True).first()
    return started.timestamp() if started else None


def recorded_starts(job_ids: Sequence[str]) -> list[float]:
    """Start times of those of these runs that started, from their records."""
    from kumiko_jobs.models import JobRun

    starts: list[float] = []
    for at in range(0, len(job_ids), 1000):
        chunk = JobRun.objects.filter(job_id__in=job_ids[at : at + 1000], started_at__isnull=False)
        starts += [started.timestamp() for started in chunk.values_list("started_at", flat=True)]
    return starts


def started_at(client: redis.Redis, job_id: str) -> float | None:
    raw = client.hget(f"rq:job:{job_id}", "started_at")
    return utcparse(raw.decode()).timestamp() if raw else None


def _two_tenants() -> tuple[str, str]:
    from project.demo.models import Tenant

    ids = [str(pk) for pk in Tenant.objects.filter(active=True).order_by("pk").values_list("pk", flat=True)]
    if len(ids) < 2:
        raise BenchError("the tenancy bench needs two active demo tenants (project/demo seeds three)")
    return ids[0], ids[1]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"


def _range(seconds: Sequence[float], jobs: int) -> str:
    if len(seconds) < 2:
        return ""
    return f"; range {jobs / max(seconds):,.0f}..{jobs / min(seconds):,.0f}/s"
