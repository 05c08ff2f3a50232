"""Put finished, failed or canceled runs back in their flows: the operators' "requeue".

Stock RQ's requeue pushes the id onto the plain RQ list, where kumiko's sweep would route it
into its flow without taking its skip limits again, so the run's end would release them a
second time. This script does the whole step atomically per job instead: take the limits
again (refusing the job when a limit is full, as dispatch would), take it out of RQ's failed,
finished and canceled registries, clear its expiry and push it into its flow. A scheduled job
(a retry or deferral waiting for its time) still holds its limits and is just moved up.
The run repeats its last attempt; its row goes back to ``queued``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import redis
from django.db import DatabaseError
from rq.utils import as_text

from kumiko_jobs import guarded_writes, records
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.definitions import LANES
from kumiko_jobs.exceptions import MalformedJob
from kumiko_jobs.gates import gates_for
from kumiko_jobs.jobdata import JobMeta, rq_time
from kumiko_jobs.registry import registry
from kumiko_jobs.scripts import RequeueArgs, argv, scripts_for

logger = logging.getLogger("kumiko_jobs")
BATCH = 200


@dataclass(frozen=True)
class RequeueResult:
    """Which jobs went back to their flows, and why the others did not (job id -> reason)."""

    requeued: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)


def requeue_jobs(job_ids: Iterable[str], *, client: redis.Redis | None = None) -> RequeueResult:
    """Requeue these jobs if they are finished, failed, canceled or scheduled; see the module doc."""
    client = client or get_redis()
    keys = get_keys()
    ids = list(dict.fromkeys(job_ids))
    requeued: list[str] = []
    refused: dict[str, str] = {}
    for start in range(0, len(ids), BATCH):
        batch = ids[start : start + BATCH]
        now = datetime.now(UTC)
        # Read before the script: a run requeued here may be run again and end before its row
        # is marked queued, and that new outcome must stay (mark_requeued_by_operator).
        try:
            finished_before = records.finish_times(batch)
        except DatabaseError:
            finished_before = {}  # the rows keep their status until the runs end again
            logger.warning("kumiko_jobs: requeue could not read the runs' records", exc_info=True)
        # A run retried by hand already runs again as its retry: requeuing the original too
        # would run the job twice.
        try:
            retried = records.retried_job_ids(batch)
        except DatabaseError:
            retried = {}
            logger.warning("kumiko_jobs: requeue could not read the runs' retries", exc_info=True)
        for job_id, retry in retried.items():
            refused[job_id] = f"it was retried already, by run {retry}"
        batch = [job_id for job_id in batch if job_id not in retried]
        if not batch:
            continue
        limits = _limits_of(client, batch)
        args: list[str] = []
        for job_id, job_limits in zip(batch, limits, strict=True):
            args += [job_id, "\n".join(str(limit) for limit, _ in job_limits)]
        api_queue, worker_queue = (keys.queue_name(lane) for lane in LANES)
        header = RequeueArgs(api_queue, worker_queue, rq_time(now))
        codes = scripts_for(client).requeue(keys=[keys.active], args=argv(header, *args))
        in_batch: list[str] = []
        for job_id, job_limits, raw in zip(batch, limits, codes, strict=True):
            code = raw.decode()
            if code == "q":
                in_batch.append(job_id)
            elif code.startswith("s"):
                refused[job_id] = f"its {job_limits[int(code[1:]) - 1][1]} limit is full"
            else:
                refused[job_id] = {"n": "no such job", "o": "not a kumiko_jobs job of these lanes"}.get(
                    code, f"it is {code}"
                )
        if in_batch:
            guarded_writes.safe(
                records.mark_requeued_by_operator, in_batch, now=now, finished_before=finished_before
            )
            requeued += in_batch
    if requeued:
        logger.info("kumiko_jobs: requeued %d job(s) by operator request", len(requeued))
    return RequeueResult(tuple(requeued), refused)


def _limits_of(client: redis.Redis, job_ids: list[str]) -> list[list[tuple[int, str]]]:
    """Per job, (limit, reason) for each key of its stored limit keys, from its declaration;
    0 (no check) where the declaration is gone or no longer has that limit."""
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(get_keys().job(job_id), "meta", "kumiko_lk")
    out: list[list[tuple[int, str]]] = []
    for meta_raw, lk in pipe.execute():
        stored = [key for key in as_text(lk or b"").split("\n") if key]
        declared: dict[str, tuple[int, str]] = {}
        try:
            meta = JobMeta.from_json(meta_raw) if meta_raw else None
        except MalformedJob:
            meta = None
        definition = registry.find(meta.job_name) if meta else None
        if meta and definition:
            gates = gates_for(definition, meta.tenant_id, get_keys())
            declared = {limit.key: (limit.limit, limit.reason) for limit in gates.limits}
        out.append([declared.get(key, (0, "")) for key in stored])
    return out
