"""Retention: delete history older than ``RUN_RETENTION`` / ``AUDIT_RETENTION``, in batches.

What goes: finished runs (succeeded, failed, dropped) queued and finished before the run cutoff;
tenant failure records whose last failure is older than that cutoff (the runs they describe
are pruned with them, and a failure that keeps recurring keeps its record alive); escape-hatch
audits last seen before the audit cutoff. Queued, running and deferred runs are never pruned,
however old.

Each batch is one index range read (``kj_run_queued_at``, ``kj_failure_age``, ``kj_audit_age``)
of at most ``batch`` rows and one ``DELETE ... WHERE id IN (...)``, so no statement grows with
the table and no long lock is held; the walk continues after the last key it saw, so old
unfinished runs are stepped over once, not re-read by every batch. Runs are walked by
``queued_at`` (an index every dispatch maintains anyway) rather than by ``finished_at``, which
would need an index that every finished attempt pays for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import QuerySet

from kumiko_jobs import keyset, records
from kumiko_jobs.conf import get_config
from kumiko_jobs.models import FINISHED_STATUSES, EscapeHatchAudit, JobRun, TenantFailure

logger = logging.getLogger("kumiko_jobs")
BATCH = 1000


@dataclass(frozen=True)
class PruneReport:
    """What ``prune()`` deleted (or, with ``dry_run``, would delete)."""

    runs: int
    tenant_failures: int
    audits: int
    run_cutoff: datetime
    audit_cutoff: datetime
    dry_run: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "tenant_failures": self.tenant_failures,
            "audits": self.audits,
            "run_cutoff": self.run_cutoff.isoformat(),
            "audit_cutoff": self.audit_cutoff.isoformat(),
            "dry_run": self.dry_run,
        }


def prune(*, dry_run: bool = False, now: datetime | None = None, batch: int = BATCH) -> PruneReport:
    """Delete history older than the retention settings; with ``dry_run`` only count it."""
    config = get_config()
    now = now or datetime.now(UTC)
    run_cutoff = now - timedelta(seconds=int(config["RUN_RETENTION"]))
    audit_cutoff = now - timedelta(seconds=int(config["AUDIT_RETENTION"]))
    old_runs = JobRun.objects.filter(
        queued_at__lt=run_cutoff, finished_at__lt=run_cutoff, status__in=FINISHED_STATUSES
    )
    runs = _sweep(old_runs, "queued_at", batch, None if dry_run else records.delete_runs)
    old_failures = TenantFailure.objects.filter(last_failed_at__lt=run_cutoff)
    failures = _sweep(old_failures, "last_failed_at", batch, None if dry_run else _deleter(old_failures))
    old_audits = EscapeHatchAudit.objects.filter(last_seen__lt=audit_cutoff)
    audits = _sweep(old_audits, "last_seen", batch, None if dry_run else _deleter(old_audits))
    report = PruneReport(runs, failures, audits, run_cutoff, audit_cutoff, dry_run)
    logger.info(
        "kumiko_jobs: %s %d runs, %d tenant failure records (older than %s) and %d audits (older than %s)",
        "would prune" if dry_run else "pruned",
        runs,
        failures,
        run_cutoff.isoformat(timespec="seconds"),
        audits,
        audit_cutoff.isoformat(timespec="seconds"),
    )
    return report


def _sweep(rows: QuerySet[Any], field: str, batch: int, delete: Any) -> int:
    total = 0
    for keys in _batches(rows, field, batch):
        total += delete(keys) if delete is not None else len(keys)
    return total


def _batches(rows: QuerySet[Any], field: str, batch: int) -> Iterator[list[Any]]:
    """Primary keys of ``rows`` in (field, pk) order, ``batch`` at a time (keyset pagination)."""
    after: tuple[Any, Any] | None = None
    while True:
        page = rows
        if after is not None:
            page = keyset.after(page, field, *after)
        found = list(page.order_by(field, "pk").values_list(field, "pk")[:batch])
        if not found:
            return
        yield [pk for _, pk in found]
        if len(found) < batch:
            return
        after = found[-1]


def _deleter(rows: QuerySet[Any]) -> Any:
    """Delete a batch of ``rows`` by key, still only those ``rows`` selects: a failure record or
    an audit refreshed between the batch's SELECT and its DELETE (a new failure counted on it, a
    new use) is new history, not old."""

    def delete(keys: list[Any]) -> int:
        deleted, _ = rows.filter(pk__in=keys).delete()
        return deleted

    return delete
