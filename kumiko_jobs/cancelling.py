"""Cancel queued (or scheduled) runs: the operators' "delete" in django-rq's dashboard and the
admin console.

One script call per batch does, for each job that is still waiting: take it out of its flow
(or the scheduled set, or RQ's plain list if stock RQ pushed it there), give back its skip
limits once, and set its hash to ``canceled``. A job already claimed by a worker is refused, so a
run's limits and cap slot are released exactly once: by the cancel or by the worker, never
both (a capped flow's slot is taken at claim, so a waiting run holds none). The run rows
become ``dropped``; if that write fails, stale-run repair reads ``canceled`` from Redis and
drops them later (the hash is kept for a day for that).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import redis

from kumiko_jobs import guarded_writes, records, run_events
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.definitions import LANES
from kumiko_jobs.jobdata import rq_time
from kumiko_jobs.models import JobRun
from kumiko_jobs.scripts import CancelArgs, argv, scripts_for

logger = logging.getLogger("kumiko_jobs")

# Long enough for stale-run repair to read the status of a run whose row write failed.
CANCELED_TTL = 86400
BATCH = 500

_REFUSALS = {
    "n": "no such job",
    "o": "not a kumiko_jobs job of this project's lanes",
    "started": "running: a worker has it",
}


@dataclass(frozen=True)
class CancelResult:
    """Which jobs were canceled, and why the others were not (job id -> reason)."""

    canceled: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)
    # False when the run rows could not be marked dropped (repair will do it).
    recorded: bool = True


def cancel_queued(
    job_ids: Iterable[str], *, reason: str = "Canceled by an operator.", client: redis.Redis | None = None
) -> CancelResult:
    """Cancel these jobs if they are still waiting (queued or scheduled); see the module doc."""
    client = client or get_redis()
    keys = get_keys()
    ids = list(dict.fromkeys(job_ids))
    canceled: list[str] = []
    refused: dict[str, str] = {}
    now = datetime.now(UTC)
    recorded = True
    for start in range(0, len(ids), BATCH):
        batch = ids[start : start + BATCH]
        api_queue, worker_queue = (keys.queue_name(lane) for lane in LANES)
        args = CancelArgs(api_queue, worker_queue, rq_time(now), CANCELED_TTL)
        codes = scripts_for(client).cancel(keys=[keys.active], args=argv(args, *batch))
        in_batch: list[str] = []
        absent: list[str] = []
        for job_id, raw in zip(batch, codes, strict=True):
            code = raw.decode()
            if code == "c":
                in_batch.append(job_id)
            elif code == "n":
                absent.append(job_id)
            else:
                refused[job_id] = _REFUSALS.get(code, f"already {code}")
        if in_batch:
            # Each batch's rows right after its script: a request cut off midway (emptying a
            # deep lane) leaves no canceled job with a queued row for repair to find slowly.
            recorded = guarded_writes.safe(_drop, in_batch, now=now, reason=reason) and recorded
            canceled += in_batch
        if absent:
            # Not in Redis (committed while Redis was down, or its hash lost): its waiting row is
            # what the outbox or repair would push, so dropping the row is the cancel.
            dropped = _drop_records_only(absent, now=now, reason=reason)
            canceled += dropped
            refused.update((job_id, _REFUSALS["n"]) for job_id in absent if job_id not in dropped)
    if canceled:
        logger.info("kumiko_jobs: canceled %d queued job(s): %s", len(canceled), _sample(canceled))
    return CancelResult(tuple(canceled), refused, recorded)


def _drop(job_ids: list[str], *, now: datetime, reason: str) -> None:
    run_events.dropped(records.mark_dropped(job_ids, now=now, reason=reason))


def _drop_records_only(job_ids: list[str], *, now: datetime, reason: str) -> list[str]:
    """Drop the waiting rows of jobs Redis does not hold; the job ids it dropped."""
    rows: list[JobRun] = []

    def drop() -> None:
        rows.extend(records.mark_dropped(job_ids, now=now, reason=reason))

    if not guarded_writes.safe(drop):
        return []
    run_events.dropped(rows)
    return [row.job_id for row in rows]


def _sample(ids: Sequence[str]) -> str:
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
