"""What is said when an attempt ends: one process log line per attempt (never the payload),
the attempt's metrics (metrics.py), and Django's ``task_finished`` for the runs of Django tasks
(task_execution.py).

Called by the outcome policy after the run's record is written, in the process where the
attempt ended.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from kumiko_jobs import metrics, task_execution
from kumiko_jobs.definitions import wrapped_job
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.registry import registry

logger = logging.getLogger("kumiko_jobs.runs")
_LEVELS = {"failed": logging.ERROR, "retried": logging.WARNING}


def attempt_ended(
    meta: JobMeta,
    job_id: str,
    outcome: str,
    *,
    started_at: datetime | None = None,
    final: bool = False,
    error: str | None = None,
    deferral: str | None = None,
    exc: BaseException | None = None,
) -> None:
    """Log ``outcome`` (succeeded, retried, failed, deferred, requeued) of one attempt (``error``
    is scrubbed text) and record its metrics; ``deferral`` says why a run was put back without
    using an attempt (handler, over_cap, unknown_job). For a Django task's run, send
    ``task_finished`` when it is final (``exc``: what failed it)."""
    definition = registry.find(meta.job_name)
    if definition is not None and definition.task is not None:
        task_execution.attempt_ended(definition, meta, outcome, final=final, exc=exc)
    seconds = (datetime.now(UTC) - started_at).total_seconds() if started_at else None
    metrics.attempt_ended(meta.job_name, outcome, seconds, wrapper=wrapped_job(meta.job_name) is not None)
    if deferral is not None:
        metrics.deferrals.add(1, {"job": meta.job_name, "reason": deferral})
    level = _LEVELS.get(outcome, logging.WARNING if error else logging.INFO)
    if not logger.isEnabledFor(level):
        return
    duration_ms = seconds * 1000 if seconds is not None else None
    logger.log(
        level,
        "%s %s run=%s tenant=%s attempt=%d/%d %s%s",
        outcome,
        meta.job_name,
        meta.run_id,
        meta.tenant_id or "-",
        meta.attempt,
        meta.max_attempts,
        f"{duration_ms:.1f}ms" if duration_ms is not None else "-",
        f" error={error}" if error else "",
        extra={
            "job": meta.job_name,
            "job_id": job_id,
            "run_id": meta.run_id,
            "tenant": meta.tenant_id,
            "attempt": meta.attempt,
            "final": final,
            "outcome": outcome,
            "duration_ms": duration_ms,
        },
    )
