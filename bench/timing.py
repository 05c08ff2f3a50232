"""Where the bench's seconds come from: kumiko's run records, RQ's job hashes.

kumiko deletes a succeeded job's hash at once (RESULT_TTL 0, the default), so its side is read
from the ``JobRun`` rows (``started_at`` is the claim, ``finished_at`` the end of the attempt);
RQ keeps its hashes (``started_at`` / ``ended_at``), so the baselines are read from those. Both
stamp the same moments, so first start to last end means the same on either side, and
interpreter start-up, Django set-up and worker registration fall outside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis
from rq.utils import utcparse

from bench.environment import BenchError


def recorded_busy_seconds(tag: str, count: int) -> float:
    """First start to last finish over the runs of correlation id ``tag``; all ``count`` of
    them must have succeeded."""
    from django.db.models import Count, Max, Min

    from kumiko_jobs.models import JobRun, RunStatus

    runs = JobRun.objects.filter(correlation_id=tag, status=RunStatus.SUCCEEDED)
    span = runs.aggregate(first=Min("started_at"), last=Max("finished_at"), n=Count("pk"))
    if span["n"] != count or span["first"] is None or span["last"] is None:
        raise BenchError(f"runjobs finished {count} jobs but only {span['n']} JobRun rows say succeeded")
    return float((span["last"] - span["first"]).total_seconds())


@dataclass(frozen=True)
class Overlap:
    """The span in which every worker process that ran some of a round's runs was working: from
    the last one's first claim to the first one's last finish, and the runs claimed and finished
    inside it. With one process it is the whole round."""

    start: float  # the span's ends as time.time(), the clock bench/machine_cpu.py samples on
    end: float
    jobs: int
    # Processes that worked at one moment (a short round can end before one starts, or one can
    # run everything before another begins: then 1).
    workers: int
    stagger: float  # first claim of the last process to start minus that of the first

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def per_second(self) -> float:
        return self.jobs / self.seconds


def recorded_overlap(tag: str) -> Overlap:
    """``Overlap`` of the runs of correlation id ``tag`` (their run records name the worker
    process that ran each). A supervisor's children start up side by side, and on 2 cores the
    one that claims first slows the other's start-up: in a round of a few seconds, the time only
    one of them works would make a start-up cost look like a throughput one."""
    from django.db.models import Max, Min

    from kumiko_jobs.models import JobRun, RunStatus

    runs = JobRun.objects.filter(correlation_id=tag, status=RunStatus.SUCCEEDED)
    spans = list(runs.values("worker").annotate(first=Min("started_at"), last=Max("finished_at")))
    if not spans:
        raise BenchError(f"no run of {tag} succeeded")
    start, end = max(span["first"] for span in spans), min(span["last"] for span in spans)
    stagger = start - min(span["first"] for span in spans)
    workers = len(spans)
    if end <= start:
        # One process ran (nearly) all the runs before another began: a short round on a busy
        # machine (the quick bench beside the test suite). The whole round stands in, counted
        # as one process working, and the note says in how many rounds that happened.
        start, end = min(span["first"] for span in spans), max(span["last"] for span in spans)
        workers = 1
    jobs = runs.filter(started_at__gte=start, finished_at__lte=end).count()
    return Overlap(start.timestamp(), end.timestamp(), jobs, workers, stagger.total_seconds())


def recorded_start(job_id: str) -> float | None:
    """When kumiko started a run (its claim), from its record; None: not started yet."""
    from kumiko_jobs.models import JobRun

    started = JobRun.objects.filter(job_id=job_id).values_list("started_at", flat=True).first()
    return started.timestamp() if started else None


def recorded_starts(job_ids: Sequence[str]) -> list[float]:
    """Start times of those of these runs that started, from their records."""
    from kumiko_jobs.models import JobRun

    starts: list[float] = []
    for at in range(0, len(job_ids), 1000):
        chunk = JobRun.objects.filter(job_id__in=job_ids[at : at + 1000], started_at__isnull=False)
        starts += [started.timestamp() for started in chunk.values_list("started_at", flat=True) if started]
    return starts


def succeeded_runs() -> int:
    """Runs of the bench database that succeeded so far (a worker's progress, read without Redis)."""
    from kumiko_jobs.models import JobRun, RunStatus

    return JobRun.objects.filter(status=RunStatus.SUCCEEDED).count()


def rq_busy_seconds(client: redis.Redis, job_ids: Sequence[str]) -> float:
    """First ``started_at`` to last ``ended_at`` over RQ job hashes; every job must have finished."""
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


def rq_started_at(client: redis.Redis, job_id: str) -> float | None:
    """When an RQ worker started this job, from its hash; None: not started yet."""
    raw = client.hget(f"rq:job:{job_id}", "started_at")
    if not raw:
        return None
    return utcparse(raw.decode() if isinstance(raw, bytes) else raw).timestamp()
