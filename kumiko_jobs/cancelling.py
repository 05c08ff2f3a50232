"""Cancel waiting runs (queued or scheduled): the admin console's "cancel queued" action.

One script call per batch (lua/cancel.lua) does, for each job still waiting: take it out of
its flow (or the scheduled set, or RQ's plain list where stock RQ pushed it), give back its
skip limits once, and mark its hash ``canceled``. A job a worker already claimed is refused, so
limits and cap slots are released exactly once, by the cancel or by the worker (a capped flow's
slot is taken at claim, so a waiting run holds none). The runs (queued, or deferred) become
``dropped`` and job_dropped is sent. The canceled hash is kept a day, so a row whose write
failed can be settled from Redis' ``canceled`` status.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import redis
from rq.utils import utcformat

from kumiko_jobs import records, run_events
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.keys import LANES
from kumiko_jobs.models import RunStatus
from kumiko_jobs.scripts import CancelArgs, argv, scripts_for

logger = logging.getLogger("kumiko_jobs")
CANCELED_TTL = 86400
# Run states of a job Redis holds as queued or scheduled (a retry or a deferral waits scheduled).
WAITING = (RunStatus.QUEUED, RunStatus.DEFERRED)
BATCH = 500
_REFUSALS = {
    "n": "no such job in Redis",
    "o": "not a kumiko_jobs job of this project's lanes",
    "started": "running: a worker has it",
}


@dataclass(frozen=True)
class CancelResult:
    """Which jobs were canceled, and why the others were not (job id -> reason)."""

    canceled: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)
    # False when the run rows could not be marked dropped (repair settles them later).
    recorded: bool = True


def cancel_queued(
    job_ids: Iterable[str], *, reason: str = "Canceled by an operator.", client: redis.Redis | None = None
) -> CancelResult:
    """Cancel these jobs if they are still waiting; see the module docstring."""
    client = client or get_redis()
    keys = get_keys()
    ids = list(dict.fromkeys(job_ids))
    now = datetime.now(UTC)
    lane_keys = [key for lane in LANES for key in (keys.scheduled(lane), keys.queue(lane))]
    lane_args = [value for lane in LANES for value in (keys.queue_name(lane), keys.lane(lane))]
    canceled: list[str] = []
    refused: dict[str, str] = {}
    for start in range(0, len(ids), BATCH):
        batch = ids[start : start + BATCH]
        args = argv(
            CancelArgs(now_iso=utcformat(now), ttl=CANCELED_TTL, lanes=len(LANES)), *lane_args, *batch
        )
        codes = scripts_for(client).cancel(keys=[keys.active, *lane_keys], args=args)
        for job_id, raw in zip(batch, codes, strict=True):
            code = raw.decode()
            if code == "c":
                canceled.append(job_id)
            else:
                refused[job_id] = _REFUSALS.get(code, f"already {code}")
    recorded = True
    if canceled:
        recorded = records.safe(_drop, canceled, now=now, reason=reason)
        logger.info("kumiko_jobs: canceled %d waiting job(s): %s", len(canceled), ", ".join(canceled[:5]))
    return CancelResult(tuple(canceled), refused, recorded)


def _drop(job_ids: list[str], *, now: datetime, reason: str) -> None:
    dropped = records.mark_dropped(job_ids, now=now, reason=reason, waiting=WAITING)
    run_events.dropped(dropped)
