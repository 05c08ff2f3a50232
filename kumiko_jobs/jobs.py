"""kumiko_jobs' own jobs (autodiscovered like any installed app's jobs module)."""

from __future__ import annotations

from typing import Any

from kumiko_jobs.context import JobContext
from kumiko_jobs.definitions import cron
from kumiko_jobs.registry import job
from kumiko_jobs.retention import prune


@job("kumiko_jobs.prune_history", trigger=cron("17 3 * * *"), concurrency="skip", concurrency_scope="job")
def prune_history(payload: dict[str, Any], ctx: JobContext) -> None:
    """Daily retention (03:17 UTC): the same as ``manage.py jobs prune``; ``{"dry_run": true}``
    only counts. Dispatch it by hand to prune now."""
    report = prune(dry_run=bool(payload.get("dry_run", False)))
    ctx.log.info(
        "%s %d runs, %d tenant failure records, %d audits",
        "would prune" if report.dry_run else "pruned",
        report.runs,
        report.tenant_failures,
        report.audits,
    )
