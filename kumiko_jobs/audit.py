"""Escape-hatch audits: one row per (job, tenant, kind) and window, shared by all processes.

Redis decides which process writes the window's row (SET NX), so audit volume does not grow
with the number of workers; later uses in the window only bump its count.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import redis
from django.db import DatabaseError
from django.db.models import F

from kumiko_jobs.conf import get_config
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.models import EscapeHatchAudit

if TYPE_CHECKING:
    from kumiko_jobs.context import JobContext

logger = logging.getLogger("kumiko_jobs.audit")
SYSTEM_ACTOR = "kumiko-system"


def report_use(ctx: JobContext, kind: str) -> None:
    """Record one use; never raises (a failing audit write must not fail the job)."""
    try:
        _report(ctx, kind)
    except (DatabaseError, redis.RedisError):
        logger.exception("kumiko_jobs: escape-hatch audit write failed for %s (%s)", ctx.job_name, kind)


def _report(ctx: JobContext, kind: str) -> None:
    window = int(get_config().get("AUDIT_WINDOW", 60))
    now = datetime.now(UTC)
    start = int(now.timestamp()) // window * window
    window_start = datetime.fromtimestamp(start, UTC)
    tenant = ctx.tenant_id or ""
    key = f"{get_keys().prefix}:audit:{ctx.job_name}:{tenant}:{kind}:{start}"
    first = get_redis().set(key, "1", nx=True, ex=window * 2)
    definition = ctx.definition
    reason = definition.escape_hatch.reason if definition.escape_hatch else f"system_scope job {ctx.job_name}"
    if first:
        EscapeHatchAudit.objects.create(
            job_name=ctx.job_name,
            tenant_id=tenant,
            kind=kind,
            reason=reason,
            actor=SYSTEM_ACTOR,
            caller=ctx.triggered_by,
            run_id=ctx.run_id,
            window_start=window_start,
            first_seen=now,
            last_seen=now,
        )
        return
    updated = EscapeHatchAudit.objects.filter(
        job_name=ctx.job_name, tenant_id=tenant, kind=kind, window_start=window_start
    ).update(count=F("count") + 1, last_seen=now)
    if not updated:
        # The first writer's insert has not landed yet (or failed): keep the use anyway.
        EscapeHatchAudit.objects.get_or_create(
            job_name=ctx.job_name,
            tenant_id=tenant,
            kind=kind,
            window_start=window_start,
            defaults={
                "reason": reason,
                "actor": SYSTEM_ACTOR,
                "caller": ctx.triggered_by,
                "run_id": ctx.run_id,
                "first_seen": now,
                "last_seen": now,
            },
        )
