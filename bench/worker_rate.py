"""Worker side: ``runjobs --lane worker --burst`` against RQ's SimpleWorker and forking Worker.

Each worker is a child process started on a queue filled beforehand. The rate is taken from
the job hashes, which every system stamps the same way (RQ's ``started_at`` / ``ended_at``):
jobs / (last ``ended_at`` - first ``started_at``). Interpreter start-up, Django set-up and
worker registration fall before the first claim, so they are excluded; the child's wall time
is reported next to it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from rq import Queue
from rq.serializers import JSONSerializer
from rq.utils import utcparse

from bench.environment import BenchEnv, BenchError
from bench.results import Rate
from bench.rqtasks import noop

ENQUEUE_BATCH = 500
# -v 0: kumiko_jobs and RQ log at WARNING, like the RQ baselines.
RUNJOBS = ("manage.py", "runjobs", "--lane", "worker", "--burst", "-v", "0")


def fill_lane(env: BenchEnv, count: int, tag: str, job: str = "bench.noop", **payload: Any) -> list[str]:
    """Queue ``count`` ``job`` runs through dispatch() (payload ``{"i": i, **payload}``): rows in
    one transaction, pushes on commit."""
    from django.db import transaction

    from kumiko_jobs import dispatch

    job_ids: list[str] = []
    with transaction.atomic():
        for i in range(count):
            result = dispatch(
                job, {"i": i, **payload}, tenant=env.tenant_id, correlation_id=f"{env.prefix}_{tag}"
            )
            job_ids.append(str(result.job_id))
    return job_ids


def fill_rq_queue(
    client: redis.Redis, queue_name: str, count: int, func: Callable[..., None] = noop, *args: Any
) -> list[str]:
    """Queue ``count`` raw jobs ``func(*args, i)`` with enqueue_many (fast, so filling does not
    dominate the run)."""
    queue = Queue(queue_name, connection=client, serializer=JSONSerializer)
    job_ids = [f"{queue_name}_{i}" for i in range(count)]
    for start in range(0, count, ENQUEUE_BATCH):
        batch = job_ids[start : start + ENQUEUE_BATCH]
        with client.pipeline() as pipe:
            queue.enqueue_many(
                [
                    Queue.prepare_data(func, (*args, start + n), job_id=job_id)
                    for n, job_id in enumerate(batch)
                ],
                pipeline=pipe,
            )
            pipe.execute()
    return job_ids


def busy_seconds(client: redis.Redis, job_ids: Sequence[str]) -> float:
    """First start to last end over the jobs' hashes; every job must have finished."""
    with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(f"rq:job:{job_id}", "status", "started_at", "ended_at")
        rows = pipe.execute()
    unfinished = [
        job_id for job_id, (status, _, _) in zip(job_ids, rows, strict=True) if status != b"finished"
    ]
    if unfinished:
        raise BenchError(f"{len(unfinished)} of {len(job_ids)} jobs did not finish, e.g. {unfinished[:3]}")
    starts = [utcparse(started.decode()) for _, started, _ in rows]
    ends = [utcparse(ended.decode()) for _, _, ended in rows]
    return (max(ends) - min(starts)).total_seconds()


def recorded_busy_seconds(tag: str, count: int) -> float:
    """First start to last finish over kumiko's run records (RESULT_TTL 0, the default, deletes a
    succeeded job's hash at once; the record keeps the times): every run must have succeeded."""
    from django.db.models import Count, Max, Min

    from kumiko_jobs.models import JobRun, RunStatus

    runs = JobRun.objects.filter(correlation_id=tag, status=RunStatus.SUCCEEDED)
    span = runs.aggregate(first=Min("started_at"), last=Max("finished_at"), n=Count("pk"))
    if span["n"] != count or span["first"] is None or span["last"] is None:
        raise BenchError(f"runjobs finished {count} jobs but only {span['n']} JobRun rows say succeeded")
    return float((span["last"] - span["first"]).total_seconds())


def _timeout(count: int, slowest_rate: float) -> float:
    return 60 + count / slowest_rate


@dataclass(frozen=True)
class Round:
    busy: float  # first started_at to last ended_at
    wall: float  # child process start to exit


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
    """Fill the lane with ``count`` runs of ``job``, work them off with one burst ``runjobs``
    (plus ``extra_args``, with ``child_env`` in its environment), check every run record says
    succeeded."""
    job_ids = fill_lane(env, count, tag, job, **(payload or {}))
    runjobs = (*RUNJOBS, *extra_args)
    argv = runjobs if profile is None else ("-m", "cProfile", "-o", str(profile), *runjobs)
    started = time.perf_counter()
    env.run_child(argv, timeout=_timeout(count, 20), **(child_env or {}))
    wall = time.perf_counter() - started
    return Round(recorded_busy_seconds(f"{env.prefix}_{tag}", len(job_ids)), wall)


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
    return Round(busy_seconds(client, job_ids), wall)


def measure_workers(env: BenchEnv, count: int, fork_count: int, rounds: int) -> tuple[Rate, Rate, Rate]:
    """Rounds rotate the order of the three workers; each rate is the median round's."""
    ours = Rate("runjobs --lane worker", count)
    simple = Rate("rq SimpleWorker", count)
    fork = Rate("rq Worker (fork per job)", fork_count)
    walls: dict[str, list[float]] = {rate.label: [] for rate in (ours, simple, fork)}
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
            walls[rate.label].append(result.wall)
    for rate in (ours, simple, fork):
        rate.note = f"child wall {statistics.median(walls[rate.label]):.1f}s incl. start-up"
    ours.note = "records on; " + ours.note
    return ours, simple, fork
