"""Reconcile run records with Redis: the repair half of "a crash is visible and repairable".

Workers write a run's outcome before telling Redis, and kumiko commits its own record writes
asynchronously on PostgreSQL, so a crash of a worker or of the database can leave a row that
says queued or running for a job Redis has already finished; and a job hash can vanish behind
kumiko's back while its run is unfinished. Every minute one worker per lane walks this
prefix's unfinished rows older than twice the lease (oldest first, resuming where it stopped)
and asks Redis what became of each job, one pipelined HGET per batch, no queue scans:

- Redis says finished, failed or canceled: the row takes that outcome (a lost outcome write);
- Redis no longer has the job: the run is pushed again from its record (rebuild.py), unless it
  is running on a worker that is still alive, once the next round confirms it (suspects.py: the
  job may just have finished, its success's write on its way). A run is never failed because
  Redis forgot it.

Only unfinished rows are read, so a finished run is never rewritten.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import redis
from django.db.models import Q
from rq.utils import as_text

from kumiko_jobs import keyset, rebuild, records
from kumiko_jobs.conf import get_config
from kumiko_jobs.keys import Keys
from kumiko_jobs.models import ACTIVE_STATUSES, JobRun, RunStatus
from kumiko_jobs.suspects import Suspects

logger = logging.getLogger("kumiko_jobs")
BATCH = 200
INTERVAL = 60.0
# "canceled": replaced or canceled by an operator (cancelling.py) after its row write was lost.
_REDIS_TO_RUN = {
    b"finished": RunStatus.SUCCEEDED,
    b"failed": RunStatus.FAILED,
    b"canceled": RunStatus.DROPPED,
}
_NOTES = {
    RunStatus.SUCCEEDED: "",
    RunStatus.FAILED: "Repaired from Redis: the outcome write was lost (worker or database crash).",
    RunStatus.DROPPED: "Canceled while its record write was lost; repaired from Redis.",
}


def repair_stale_runs(client: redis.Redis, keys: Keys, lane: str) -> int:
    """Fix up to BATCH rows whose state Redis contradicts; returns how many were changed."""
    if not client.set(keys.repair_lock(lane), "1", nx=True, ex=int(INTERVAL)):
        return 0
    fields = (*rebuild.ROW_FIELDS, "worker")
    stale = rebuild.owned_by(keys) & Q(lane=lane, status__in=ACTIVE_STATUSES)
    suspects = Suspects(keys.suspects(lane, "repair"), stale)
    due = suspects.due(client, fields)
    # The job hash alone is gone (the dataset is intact, or the epoch would have changed): its
    # skip limits are still counted, so the push does not count them again.
    changed = rebuild.repush(client, rebuild.lost_runs(client, keys, due.rows), admit=False)
    suspects.forget(client, due)
    now = datetime.now(UTC)
    cutoff = now - timedelta(seconds=2 * float(get_config()["ABANDON_AFTER"]))
    mark_key = keys.repair_mark(lane)
    mark = client.get(mark_key)
    rows = JobRun.objects.filter(stale, updated_at__lt=cutoff)
    if mark:
        stamp, _, mark_pk = as_text(mark).partition("|")
        after = datetime.fromisoformat(stamp)
        rows = keyset.after(rows, "updated_at", after, mark_pk)
    batch = list(rows.order_by("updated_at", "pk").only(*fields)[:BATCH])
    if len(batch) < BATCH:
        client.delete(mark_key)  # reached the newest stale row: start from the oldest next time
    else:
        last = batch[-1]
        client.set(mark_key, f"{last.updated_at.isoformat()}|{last.pk}")
    if not batch:
        return changed
    pipe = client.pipeline(transaction=False)
    for row in batch:
        pipe.hget(keys.job(row.job_id), "status")
    lost = []
    for row, redis_status in zip(batch, pipe.execute(), strict=True):
        if redis_status is None:
            lost.append(row)
            continue
        target = _REDIS_TO_RUN.get(redis_status)
        if target is None:
            continue  # queued, scheduled or started in Redis: the row is right (or will be)
        changed += records.repair_status(
            row.pk, expected=row.status, status=target, now=now, error=_NOTES[target]
        )
        logger.warning(
            "kumiko_jobs: repaired run %s (job %s): %s -> %s", row.pk, row.job_id, row.status, target
        )
    suspects.note(client, [row for row in lost if not rebuild.running_on_a_live_worker(client, keys, row)])
    return changed
