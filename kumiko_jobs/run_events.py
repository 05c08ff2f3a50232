"""What is said when a run changes state: one process log line per finished attempt (never the
payload), the attempt's metrics (metrics.py), the lifecycle signals of ``kumiko_jobs.signals``,
and Django's ``task_finished`` for the runs of Django tasks (task_execution.py).

Called after the run's record is written, in the process where the change happened: the
outcome policy (outcomes.py) for attempts, dispatching.py for queued and dropped runs, the
run observers (execution.py, run_marker.py) for starts. A signal whose job has no receiver
costs one check; receivers that raise are logged and never fail the job.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.dispatch import Signal

from kumiko_jobs import metrics, signals, task_execution
from kumiko_jobs.definitions import wrapped_job
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.registry import registry
from kumiko_jobs.run_rows import RunRow
from kumiko_jobs.signals import RunInfo

logger = logging.getLogger("kumiko_jobs.runs")
signal_logger = logging.getLogger("kumiko_jobs.signals")
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
    ended_at: datetime | None = None,
) -> None:
    """Log ``outcome`` (succeeded, retried, failed, deferred, requeued) of one attempt (``error``
    is scrubbed text) and record its metrics; ``deferral`` says why a run was put back without
    using an attempt (handler, over_cap, unknown_job). For a Django task's run, send
    ``task_finished`` when it is final (``exc``: what failed it). ``ended_at``: when the attempt
    ended, where that was before now (a worker says a success after its next lane step)."""
    definition = registry.find(meta.job_name)
    if definition is not None and definition.task is not None:
        task_execution.attempt_ended(definition, meta, outcome, final=final, exc=exc)
    seconds = ((ended_at or datetime.now(UTC)) - started_at).total_seconds() if started_at else None
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


# Signals ------------------------------------------------------------------------------------


def started(meta: JobMeta, job_id: str) -> None:
    _announce(signals.job_started, meta, job_id, RunStatus.RUNNING)


def succeeded(meta: JobMeta, job_id: str) -> None:
    _announce(signals.job_succeeded, meta, job_id, RunStatus.SUCCEEDED)


def failed(meta: JobMeta, job_id: str, *, final: bool, error: str) -> None:
    """An attempt failed; the message (already scrubbed by the outcome policy, as stored on the
    run) travels only with the final failure."""
    status = RunStatus.FAILED if final else RunStatus.QUEUED
    _announce(signals.job_failed, meta, job_id, status, error=error if final else None, final=final)


def deferred(meta: JobMeta, job_id: str) -> None:
    _announce(signals.job_deferred, meta, job_id, RunStatus.DEFERRED)


def queued(rows: Iterable[RunRow]) -> None:
    """New runs were queued (their rows are written and Redis has them)."""
    for row in rows:
        if _listened(signals.job_queued, row.job_name):
            _send(signals.job_queued, _info_of_row(row, RunStatus.QUEUED))


def dropped(rows: Iterable[JobRun | RunRow]) -> None:
    """Waiting runs that will never run (replaced, canceled, refused when their transaction
    committed); ``rows`` need the fields of ``DROPPED_FIELDS``."""
    for row in rows:
        if _listened(signals.job_dropped, row.job_name):
            _send(signals.job_dropped, _info_of_row(row, RunStatus.DROPPED))


# The fields a row needs for RunInfo (callers that load rows for dropped() use ``only()``).
DROPPED_FIELDS = ("id", "job_id", "job_name", "tenant_id", "attempt", "max_attempts", "lane")


def _announce(signal: Signal, meta: JobMeta, job_id: str, status: str, **extra: Any) -> None:
    if not _listened(signal, meta.job_name):
        return
    error = extra.pop("error", None)
    info = _info(meta.run_id, job_id, meta, status, error)
    _send(signal, info, **extra)


def _info_of_row(row: JobRun | RunRow, status: str) -> RunInfo:
    return _info(str(row.id), row.job_id, row, status)


def _info(
    run_id: str, job_id: str, run: JobMeta | JobRun | RunRow, status: str, error: str | None = None
) -> RunInfo:
    return RunInfo(
        run_id=run_id,
        job_id=job_id,
        job_name=run.job_name,
        tenant_id=run.tenant_id,
        attempt=run.attempt,
        final_attempt=run.attempt >= run.max_attempts,
        lane=run.lane,
        status=str(status),
        error=error,
    )


def _listened(signal: Signal, sender: str) -> bool:
    # Building a RunInfo for nobody would cost every job; most projects connect few receivers.
    return bool(signal.receivers) and signal.has_listeners(sender)


def _send(signal: Signal, info: RunInfo, **extra: Any) -> None:
    try:
        # Interned: receivers connected with sender="<job name>" match by identity (JobSignal).
        responses = signal.send_robust(sender=sys.intern(info.job_name), run=info, **extra)
    except Exception:
        # send_robust catches receivers' exceptions; this is a receiver that cannot be called.
        signal_logger.exception("kumiko_jobs: sending a signal for run %s failed", info.run_id)
        return
    for receiver, response in responses:
        if isinstance(response, Exception):
            signal_logger.error(
                "kumiko_jobs: receiver %s raised for run %s (%s, status %s); the run is not affected",
                getattr(receiver, "__qualname__", repr(receiver)),
                info.run_id,
                info.job_name,
                info.status,
                exc_info=response,
            )
