"""Escape-hatch audits: one row per (job, tenant, kind) and window, shared by all processes.

Uses are counted on the run's context and written when the handler has returned (or raised),
outside its transactions: a rolled-back handler transaction cannot take the audit with it,
and SQLite's single writer is never waited on from inside the job. Redis decides which
process inserts the window's row (SET NX), so audit volume does not grow with the number of
workers; the unique constraint settles any race, and later uses only bump the count.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import redis
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import F

from kumiko_jobs.conf import get_config
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.metrics import escape_hatch_uses
from kumiko_jobs.models import EscapeHatchAudit

if TYPE_CHECKING:
    from kumiko_jobs.context import JobContext

logger = logging.getLogger("kumiko_jobs.audit")
SYSTEM_ACTOR = "kumiko-system"


def report_use(ctx: JobContext, kind: str, acting_as: str | None = None) -> None:
    """Count one use on the run; logged at once so even a crashed run leaves a trace.
    ``acting_as``: the identity ``ctx.as_user()`` switched to (each use's line names it; the
    window's audit row counts the uses)."""
    ctx.audit_uses[kind] = ctx.audit_uses.get(kind, 0) + 1
    # Every use, deduplicated audit row or not (spec E.2).
    escape_hatch_uses.add(1, {"job": ctx.job_name, "kind": kind})
    logger.warning(
        "security:escape-hatch-used job=%s tenant=%s kind=%s run=%s caller=%s%s",
        ctx.job_name,
        ctx.tenant_id,
        kind,
        ctx.run_id,
        ctx.triggered_by,
        "" if acting_as is None else f" as={acting_as}",
    )


def flush_audits(ctx: JobContext) -> None:
    """Write the run's counted uses; never raises (a failing audit write must not fail the job)."""
    uses, ctx.audit_uses = ctx.audit_uses, {}
    for kind, count in uses.items():
        try:
            _write(ctx, kind, count)
        except (DatabaseError, redis.RedisError):
            logger.exception("kumiko_jobs: escape-hatch audit write failed for %s (%s)", ctx.job_name, kind)


def _write(ctx: JobContext, kind: str, count: int) -> None:
    window = int(get_config()["AUDIT_WINDOW"])
    now = datetime.now(UTC)
    start = int(now.timestamp()) // window * window
    window_start = datetime.fromtimestamp(start, UTC)
    tenant = ctx.tenant_id or ""
    key = get_keys().audit_window(ctx.job_name, tenant, kind, start)
    rows = EscapeHatchAudit.objects.filter(
        job_name=ctx.job_name, tenant_id=tenant, kind=kind, window_start=window_start
    )
    if not get_redis().set(key, "1", nx=True, ex=window * 2) and rows.update(
        count=F("count") + count, last_seen=now
    ):
        return
    definition = ctx.definition
    reason = definition.escape_hatch.reason if definition.escape_hatch else f"system_scope job {ctx.job_name}"
    try:
        with transaction.atomic():
            EscapeHatchAudit.objects.create(
                job_name=ctx.job_name,
                tenant_id=tenant,
                kind=kind,
                reason=reason,
                actor=SYSTEM_ACTOR,
                caller=ctx.triggered_by,
                run_id=ctx.run_id,
                window_start=window_start,
                count=count,
                first_seen=now,
                last_seen=now,
            )
    except IntegrityError:
        # Another process inserted the window's row first: count on it.
        rows.update(count=F("count") + count, last_seen=now)
