"""Worker side: ``runjobs --lane worker --burst`` against RQ's SimpleWorker and forking Worker,
and ``runjobs --processes 2`` against ``--processes 1``.

Each worker is a child process started on a queue filled beforehand. The rate is jobs / (first
start to last end): kumiko's from its run records, RQ's from its job hashes (bench/timing.py),
so interpreter start-up, Django set-up and worker registration are excluded; the child's wall
time is reported next to it, with the database connections each worker process opened (from
its shutdown line).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.children import RUNJOBS, connections_opened
from bench.environment import BenchEnv, BenchError
from bench.filling import fill, fill_lane, fill_rq_queue
from bench.machine_cpu import CpuSampler
from bench.results import Rate
from bench.rqtasks import noop
from bench.timing import Overlap, recorded_busy_seconds, recorded_overlap, rq_busy_seconds


def _timeout(count: int, slowest_rate: float) -> float:
    return 60 + count / slowest_rate


@dataclass(frozen=True)
class Round:
    busy: float  # first start to last end
    wall: float  # child process start to exit
    connections: tuple[int, ...] = ()  # database connections each runjobs process opened


def run_ours(
    env: BenchEnv,
    count: int,
    tag: str,
    profile: Path | None = None,
    *,
    job: str = "bench.noop",
    payload: Mapping[str, Any] | None = None,
    extra_args: Sequence[str] = (),
    child_env: Mapping[str, str] | None = None,
) -> Round:
    """Fill the lane with ``count`` runs of ``job`` through dispatch(), work them off with one
    burst ``runjobs`` (plus ``extra_args``, with ``child_env`` in its environment), check every
    run record says succeeded."""
    job_ids = fill_lane(env, count, tag, job, **(payload or {}))
    return work_off(env, len(job_ids), tag, extra_args, profile, child_env)


def work_off(
    env: BenchEnv,
    count: int,
    tag: str,
    extra_args: Sequence[str] = (),
    profile: Path | None = None,
    child_env: Mapping[str, str] | None = None,
) -> Round:
    """One burst ``runjobs`` (plus ``extra_args``, with ``child_env`` in its environment) on the
    queued runs of correlation tag ``tag``; every worker process must report the connections it
    opened."""
    runjobs = (*RUNJOBS, *extra_args)
    argv = runjobs if profile is None else ("-m", "cProfile", "-o", str(profile), *runjobs)
    started = time.perf_counter()
    output = env.run_child(argv, timeout=_timeout(count, 20), **(child_env or {})).stdout
    wall = time.perf_counter() - started
    connections = tuple(connections_opened(output))
    if not connections:
        raise BenchError(f"runjobs printed no shutdown line; its output:\n{output.decode()[-3000:]}")
    busy = recorded_busy_seconds(f"{env.prefix}_{tag}", count)
    return Round(busy, wall, connections)


def run_rq(
    env: BenchEnv, count: int, kind: str, tag: str, func: Callable[..., None] = noop, *args: Any
) -> Round:
    """Fill a fresh RQ queue with ``count`` jobs ``func(*args, i)``, work it off with one burst
    RQ worker child of ``kind`` (simple, fork)."""
    from kumiko_jobs.connection import get_redis

    client = get_redis()
    queue_name = f"{env.prefix}_rq_{kind}_{tag}"
    job_ids = fill_rq_queue(client, queue_name, count, func, *args)
    started = time.perf_counter()
    env.run_child(
        ("-m", "bench.rqworker", kind, queue_name, f"{queue_name}_worker"), timeout=_timeout(count, 5)
    )
    wall = time.perf_counter() - started
    return Round(rq_busy_seconds(client, job_ids), wall)


@dataclass(frozen=True)
class Workers:
    ours: Rate
    simple: Rate
    fork: Rate
    connections: int  # the most database connections runjobs opened in one round


def measure_workers(env: BenchEnv, count: int, fork_count: int, rounds: int) -> Workers:
    """Rounds rotate the order of the three workers; each rate is the median round's."""
    ours = Rate("runjobs --lane worker", count)
    simple = Rate("rq SimpleWorker", count)
    fork = Rate("rq Worker (fork per job)", fork_count)
    results: dict[str, list[Round]] = {rate.label: [] for rate in (ours, simple, fork)}
    sides: list[tuple[Rate, Callable[[str], Round]]] = [
        (ours, lambda tag: run_ours(env, count, tag)),
        (simple, lambda tag: run_rq(env, count, "simple", tag)),
        (fork, lambda tag: run_rq(env, fork_count, "fork", tag)),
    ]
    for number in range(rounds):
        shift = number % len(sides)
        for rate, run in sides[shift:] + sides[:shift]:
            result = run(f"r{number}")
            rate.seconds.append(result.busy)
            results[rate.label].append(result)
    for rate in (ours, simple, fork):
        rate.note = note(results[rate.label])
    ours.note = "records on; " + ours.note
    connections = max(n for result in results[ours.label] for n in result.connections)
    return Workers(ours, simple, fork, connections)


def measure_processes(env: BenchEnv, count: int, rounds: int) -> tuple[Rate, Rate]:
    """``runjobs --processes 1`` and ``--processes 2`` (the supervisor and its two children,
    each exiting when the lane is empty) on the same ``count`` trivial runs of one tenant,
    pushed the fast way; rounds alternate which goes first, each rate is the median round's.

    A round's rate is that of the span in which all its worker processes worked (timing.Overlap:
    for one process, the whole round), so the ratio compares two working processes with one
    rather than with one plus the other's start-up; the notes give first start to last end too,
    and how far apart the children began. They also give the whole machine's CPU per job in
    that span (the worker, PostgreSQL and Redis share the cores), and the rate the machine's
    cores would allow at two processes' CPU per job: the most ``--processes 2`` could reach."""
    rates = {processes: Rate(f"runjobs --processes {processes}", count) for processes in (1, 2)}
    results: dict[int, list[Round]] = {processes: [] for processes in rates}
    overlaps: dict[int, list[Overlap]] = {processes: [] for processes in rates}
    loads: dict[int, list[Load]] = {processes: [] for processes in rates}
    for number in range(rounds):
        for processes in (1, 2) if number % 2 == 0 else (2, 1):
            tag = f"p{processes}_r{number}"
            fill(env.prefix, "bench.noop", [env.tenant_id] * count, tag=tag)
            with CpuSampler() as sampler:
                result = work_off(env, count, tag, ("--processes", str(processes)))
            if len(result.connections) != processes:
                raise BenchError(
                    f"runjobs --processes {processes}: {len(result.connections)} worker processes "
                    "reported their shutdown"
                )
            overlap = recorded_overlap(f"{env.prefix}_{tag}")
            # Rate keeps seconds per round for a fixed job count: the time all `count` runs
            # would take at the round's all-working rate.
            rates[processes].seconds.append(count / overlap.per_second)
            results[processes].append(result)
            overlaps[processes].append(overlap)
            busy = sampler.busy_between(overlap.start, overlap.end)
            if busy is not None:
                loads[processes].append(Load(busy, busy * overlap.seconds / overlap.jobs))
    for processes, rate in rates.items():
        whole = count / statistics.median(r.busy for r in results[processes])
        rate.note = f"{note(results[processes])}; first start to last end {whole:,.0f}/s"
        if processes > 1:
            in_span = statistics.median(o.jobs for o in overlaps[processes])
            stagger = statistics.median(o.stagger for o in overlaps[processes])
            rate.note += (
                f"; rate while all {processes} worked ({in_span:,.0f} runs in it), the last "
                f"began {stagger * 1000:,.0f} ms after the first"
            )
            short = sum(o.workers < processes for o in overlaps[processes])
            if short:
                rate.note += f"; in {short} round(s) not every process worked at one moment"
        if loads[processes]:
            rate.note += f"; {load_note(loads[processes])}"
    if loads[2]:
        rates[2].note += f"; {ceiling_note(loads[2], rates[1])}"
    return rates[1], rates[2]


@dataclass(frozen=True)
class Load:
    """The whole machine in a round's all-working span: busy cores, and CPU seconds per job."""

    cores: float
    cpu_per_job: float


def load_note(loads: Sequence[Load]) -> str:
    cores = statistics.median(load.cores for load in loads)
    per_job = statistics.median(load.cpu_per_job for load in loads)
    return f"machine busy {cores:.1f} of {os.cpu_count()} cores meanwhile, {per_job * 1e6:,.0f} us CPU a job"


def ceiling_note(loads: Sequence[Load], one: Rate) -> str:
    """The rate all cores could give at these rounds' CPU per job, and its ratio to ``one``."""
    cpus = os.cpu_count() or 1
    most = cpus / statistics.median(load.cpu_per_job for load in loads)
    return f"{cpus} cores at that CPU a job allow {most:,.0f}/s, {most / one.per_second:.2f}x of one process"


def note(rounds: Sequence[Round]) -> str:
    """Child wall time (median round) and, for runjobs, the most database connections one of
    its worker processes opened in any round."""
    text = f"child wall {statistics.median(r.wall for r in rounds):.1f}s incl. start-up"
    opened = [n for r in rounds for n in r.connections]
    return f"{text}; <= {max(opened)} db connections per process" if opened else text
