"""Tenancy at scale: a quiet tenant behind a noisy one and behind 1,000 busy ones, and what
fairness costs a worker; then the enqueue side (bench/tenancy_enqueue.py): ``max_per_tenant``
under a deep queue and per-tenant fan-out.

Backlogs are pushed the fast way (bench/filling.py ``fill``); the runs that are measured go
through ``dispatch()``. Worker children are ``manage.py runjobs --lane worker`` with the bench
settings, timed from their run records (bench/timing.py). Each part stops its workers and
deletes the bench's keys and rows before the next one, so each starts on an empty lane. See
BENCHMARKS.md for what each figure means.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from rich.console import Console
from rq import Queue
from rq.serializers import JSONSerializer

from bench.children import RUNJOBS_SERVING, Child, running
from bench.environment import BenchEnv, BenchError, reset
from bench.filling import fill, fill_rq_queue
from bench.results import Figure, ms, rounds_range
from bench.rqtasks import noop
from bench.tenancy_enqueue import check_dispatch_budget, deep_queue_dispatch, fan_out
from bench.timing import recorded_busy_seconds, recorded_start, recorded_starts, rq_started_at, succeeded_runs

LATENCY_TARGET = 1.0  # seconds
FAIRNESS_TARGET = 0.9  # 1,000-tenant rate / 1-tenant rate, at least


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
    # Near its target since session 15, and one round on a 2-vCPU VM ranged 0.63-0.93 in one
    # hour (session 18): a median of three, in alternating order, costs ~10 s more.
    fanout_rounds=3,
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
    check_dispatch_budget(sizes.dispatches, sizes.dispatch_rounds)
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
    figures += deep_queue_dispatch(
        env,
        quiet,
        dispatches=sizes.dispatches,
        rounds=sizes.dispatch_rounds,
        deep_queue=sizes.deep_queue,
        deep_tenants=sizes.deep_tenants,
        deep_rows=sizes.deep_rows,
    )
    console.log(f"tenancy: fan-out to {sizes.fanout:,} tenants vs rq enqueue_many")
    figures += fan_out(env, sizes.fanout, sizes.fanout_rounds)
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
        "one serving runjobs process for all sets, paused while each set is pushed; rate from the run records"
    )
    return [
        Figure(
            f"runjobs, {sizes.fair_jobs:,} trivial jobs of 1 tenant",
            f"{one_rate:,.0f} jobs/s",
            how=f"{rounds}{how}{rounds_range(one, sizes.fair_jobs)}",
        ),
        Figure(
            f"runjobs, {sizes.fair_jobs:,} trivial jobs of {sizes.fair_tenants:,} tenants x {per_tenant}",
            f"{many_rate:,.0f} jobs/s",
            how=f"{rounds}same worker{rounds_range(many, sizes.fair_jobs)}",
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
            f"{ms(statistics.median(self.latencies))} (max {ms(worst)})",
            f"<= {LATENCY_TARGET:g} s",
            worst <= LATENCY_TARGET,
            f"median (max) of {len(self.latencies)} runs of B dispatched one at a time, the first after "
            f"{self.finished_before:,} of {backlog} runs had finished; {self.waiting:,} still queued at "
            f"the end; {backlog} runs started between a dispatch and B's start: "
            f"{', '.join(map(str, self.between))}; dispatch() call median "
            f"{ms(statistics.median(self.dispatch_seconds))}, max {ms(max(self.dispatch_seconds))}",
        )


def quiet_start(
    env: BenchEnv, head_start: int, samples: int, quiet: str, backlog: Sequence[str]
) -> QuietStart:
    """Start a worker on the backlog; once ``head_start`` runs finished, dispatch a run of the
    quiet tenant, read when the worker started it from its run record, and repeat ``samples``
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
            started = worker.wait_for(
                functools.partial(recorded_start, result.job_id), 30, "the quiet tenant's run to start"
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
        ahead = _position(client, queue.key, quiet_id)
        positioned = time.time()
        started = None
        while started is None and time.time() < dispatched_at + sizes.fifo_window:
            worker.check()
            time.sleep(0.05)
            started = rq_started_at(client, quiet_id)
        left = _position(client, queue.key, quiet_id)
        watched = time.time() - positioned
        started = started or rq_started_at(client, quiet_id)
    label = f"quiet tenant's start behind {sizes.backlog:,} jobs of one tenant (rq SimpleWorker, FIFO)"
    if ahead is None:
        raise BenchError("the FIFO baseline's quiet job left the queue before its position was read")
    ran_first = (
        f"B enqueued after {finished_before:,} of A's jobs finished, behind {ahead:,} queued ones: "
        f"all {sizes.backlog:,} of A's jobs run before B"
    )
    if started is not None:
        latency = started - dispatched_at
        return Figure(label, ms(latency), "", None, f"measured; {ran_first}")
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
    off, and return first start to last finish from their run records."""
    done_before = succeeded_runs()
    runs = [tenants[i % len(tenants)] for i in range(count)]
    with worker.paused():
        job_ids = fill(env.prefix, "bench.noop", runs, tag=tag)
    worker.wait_for(lambda: succeeded_runs() >= done_before + count, 60 + count / 20, f"{tag} to finish")
    return recorded_busy_seconds(f"{env.prefix}_{tag}", len(job_ids))


# Helpers --------------------------------------------------------------------------------------


def _position(client: redis.Redis, key: str, job_id: str) -> int | None:
    """Where ``job_id`` stands in an RQ queue list (0: next); None: no longer in it."""
    found = client.lpos(key, job_id)
    return found if isinstance(found, int) else None


def _two_tenants() -> tuple[str, str]:
    from project.demo.models import Tenant

    ids = [str(pk) for pk in Tenant.objects.filter(active=True).order_by("pk").values_list("pk", flat=True)]
    if len(ids) < 2:
        raise BenchError("the tenancy bench needs two active demo tenants (project/demo seeds three)")
    return ids[0], ids[1]
