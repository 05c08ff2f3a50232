"""Reconcile run records with Redis: the repair half of "a crash is visible and repairable".

Workers write a run's outcome before telling Redis, and kumiko commits its own record writes
asynchronously on PostgreSQL, so a crash of a worker or of the database can leave a row that
says queued or running for a job Redis has already finished. Every minute one worker per lane
walks unfinished rows older than twice the lease (oldest first, resuming where it stopped) and
asks Redis what became of each job: one pipelined HGET per batch, no queue scans.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import redis
from django.db.models import Q
from rq.utils import as_text

from kumiko_jobs import records
from kumiko_jobs.conf import get_config
from kumiko_jobs.gates import gates_for
from kumiko_jobs.keys import Keys
from kumiko_jobs.models import ACTIVE_STATUSES, JobRun, RunStatus
from kumiko_jobs.registry import registry

logger = logging.getLogger("kumiko_jobs")
BATCH = 200
INTERVAL = 60.0
# "canceled": replaced or canceled by an operator (cancelling.py) after its row write was lost.
_REDIS_TO_RUN = {
    b"finished": RunStatus.SUCCEEDED,
    b"failed": RunStatus.FAILED,
    b"canceled": RunStatus.DROPPED,
}


def repair_stale_runs(client: redis.Redis, keys: Keys, lane: str) -> int:
    """Fix up to BATCH rows whose state Redis contradicts; returns how many were changed."""
    if not client.set(keys.repair_lock(lane), "1", nx=True, ex=int(INTERVAL)):
        return 0
    now = datetime.now(UTC)
    cutoff = now - timedelta(seconds=2 * float(get_config()["ABANDON_AFTER"]))
    mark_key = keys.repair_mark(lane)
    mark = client.get(mark_key)
    rows = JobRun.objects.filter(lane=lane, status__in=ACTIVE_STATUSES, updated_at__lt=cutoff)
    if mark:
        stamp, _, mark_pk = as_text(mark).partition("|")
        after = datetime.fromisoformat(stamp)
        rows = rows.filter(Q(updated_at__gt=after) | Q(updated_at=after, pk__gt=mark_pk))
    batch = list(
        rows.order_by("updated_at", "pk").values_list(
            "pk", "job_id", "status", "updated_at", "job_name", "tenant_id"
        )[:BATCH]
    )
    if len(batch) < BATCH:
        client.delete(mark_key)  # reached the newest stale row: start from the oldest next time
    else:
        last = batch[-1]
        client.set(mark_key, f"{last[3].isoformat()}|{last[0]}")
    if not batch:
        return 0
    pipe = client.pipeline(transaction=False)
    for row in batch:
        pipe.hget(keys.job(row[1]), "status")
    changed = 0
    for (pk, job_id, status, _updated, job_name, tenant_id), redis_status in zip(
        batch, pipe.execute(), strict=True
    ):
        target = _REDIS_TO_RUN.get(redis_status) if redis_status is not None else RunStatus.FAILED
        if target is None or target == status:
            continue  # queued, scheduled or started in Redis: the row is right (or will be)
        note = (
            "Run record repaired from Redis: the outcome write was lost (worker or database crash)."
            if redis_status is not None
            else "The job is gone from Redis (expired or deleted) while its record was unfinished."
        )
        changed += records.repair_status(
            pk, expected=status, status=target, now=now, error=note if target == RunStatus.FAILED else ""
        )
        if redis_status is None:
            _forget_limits(client, keys, job_name, tenant_id)
        logger.warning("kumiko_jobs: repaired run %s (job %s): %s -> %s", pk, job_id, status, target)
    return changed


def _forget_limits(client: redis.Redis, keys: Keys, job_name: str, tenant_id: str | None) -> None:
    """A job deleted behind kumiko's back (e.g. from RQ's dashboard) never released its skip
    limits; its declaration says which they were."""
    definition = registry.find(job_name)
    if definition is None:
        return
    for limit in gates_for(definition, tenant_id, keys).limits:
        if client.hincrby(keys.active, limit.key, -1) <= 0:
            client.hdel(keys.active, limit.key)
