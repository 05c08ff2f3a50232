"""An attempt's state changes, as the worker writes them: running, and each outcome (succeeded,
retry, failed, deferred, requeued), each one guarded UPDATE through ``run_updates.update_run``.

Workers write a state *before* telling Redis about it, so a crash in between leaves the run
registered in Redis and the reaper repairs the row; it never leaves a finished job with a row
that claims it is still running. A worker's successes are built here (``prepare_succeeded``)
and written by its writer thread, several in one round trip (``write_outcomes``,
success_writes.py), before Redis is told. An outcome write that
carries the attempt's start (``Started``) also records the start, so a short run costs one
commit, and creates the row if the dispatcher's insert has not landed yet.

Every write of an attempt is conditional (``run_updates.AttemptGuard``): it applies only while the
record is not at a later attempt and the run is unfinished, or finished before the attempt
started (an operator's requeue marks the row queued after its push, so a worker may take the
run first). A worker that stalled past its lease finds that the reaper retried or failed the
run, and maybe another worker finished it since: its write raises ``StaleAttempt`` instead of
overwriting the newer state, and the worker leaves the run alone (outcomes.stale). The
reaper's own write may find the record one attempt ahead (a reaper that died between the
record and Redis wrote it): ``reaping`` allows that one.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import router
from django.db.models import Q

from kumiko_jobs import run_rows
from kumiko_jobs.exceptions import StaleAttempt
from kumiko_jobs.guarded_writes import durable, safe
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.models import ACTIVE_STATUSES, JobRun, RunStatus
from kumiko_jobs.records import insert_queued, status_of
from kumiko_jobs.run_updates import AttemptGuard, update_run, update_runs

logger = logging.getLogger("kumiko_jobs")

LogLine = dict[str, Any]


@dataclass(frozen=True)
class Started:
    """When and where an attempt started, for outcome writes that also record the start."""

    job_id: str
    payload: Mapping[str, Any]
    worker: str
    at: datetime
    # The start was recorded on its own and job_started sent (a run that lasted); short runs
    # get both with their outcome.
    announced: bool = False


def mark_running(
    *, meta: JobMeta, job_id: str, payload: Mapping[str, Any], worker: str, now: datetime
) -> None:
    values = {
        "status": RunStatus.RUNNING,
        "attempt": meta.attempt,
        "max_attempts": meta.max_attempts,
        "started_at": now,
        "finished_at": None,
        "next_attempt_at": None,
        "worker": worker,
        "updated_at": now,
    }
    guard = AttemptGuard(meta.attempt, now)
    if update_run(meta.run_id, guard=guard, **values) or _written_already(meta, values):
        return
    # The dispatcher's insert has not landed (or failed): the run still gets its row. The insert
    # ignores a conflict on any unique column (the dispatcher's row may land in between, and it
    # conflicts on the job id as well as the key), and the UPDATE then applies either way,
    # unless the row is there and has moved on.
    row = run_rows.new_run_row(
        meta=meta, job_id=job_id, payload=payload, queued_at=now, status=RunStatus.RUNNING
    )
    insert_queued([row])
    if not update_run(meta.run_id, guard=guard, **values):
        raise _stale(meta)


def mark_succeeded(
    *, meta: JobMeta, now: datetime, logs: list[LogLine], started: Started | None = None, result: Any = None
) -> None:
    """``result``: a Django task's JSON return value (None is the column's default, never written)."""
    prepare_succeeded(meta=meta, now=now, logs=logs, started=started, result=result).mark_outcome()


def prepare_succeeded(
    *, meta: JobMeta, now: datetime, logs: list[LogLine], started: Started | None = None, result: Any = None
) -> OutcomeUpdate:
    """mark_succeeded's write, built and not sent (its earlier attempts' log lines are read now)."""
    values: dict[str, Any] = {} if result is None else {"result": result}
    return OutcomeUpdate(
        meta,
        started,
        _guard(meta, started),
        _with_start(
            meta,
            started,
            status=RunStatus.SUCCEEDED,
            finished_at=now,
            updated_at=now,
            logs=_all_logs(meta, logs, now),
            error="",
            traceback="",
            **values,
        ),
    )


@dataclass(frozen=True)
class OutcomeUpdate:
    """An attempt's outcome as the UPDATE of its run, not sent yet; the row is created first if
    the dispatcher's insert has not landed. ``guard``: when the run is still this attempt's
    (module docstring)."""

    meta: JobMeta
    started: Started | None
    guard: AttemptGuard
    values: dict[str, Any]

    def mark_outcome(self) -> None:
        """Write it now, and wait for the answer; StaleAttempt if the run moved on."""
        self.complete(update_run(self.meta.run_id, guard=self.guard, **self.values))

    def complete(self, updated: int) -> None:
        """After its UPDATE, which found ``updated`` rows: create a row that did not exist yet,
        or raise StaleAttempt for one that moved on."""
        if updated or _written_already(self.meta, self.values):
            return
        if self.started is not None:
            # mark_running raises StaleAttempt itself when the row is there and moved on.
            mark_running(
                meta=self.meta,
                job_id=self.started.job_id,
                payload=self.started.payload,
                worker=self.started.worker,
                now=self.started.at,
            )
            if update_run(self.meta.run_id, guard=self.guard, **self.values):
                return
        elif status_of(self.meta.run_id) is None:
            return  # no row, and nothing to build one from (an operator deleted it)
        raise _stale(self.meta)


def write_outcomes(updates: Sequence[OutcomeUpdate]) -> set[int]:
    """Write these outcomes in one round trip and one transaction (pg_pipeline). Where that is
    not available or fails (a broken connection, a bad value), each is written on its own
    through ``guarded_writes.durable``, which waits out a database that does not answer and logs a
    write that fails again. Returns the positions of the stale ones (nothing written: their runs
    moved on, see the module docstring)."""
    stale: set[int] = set()
    try:
        counts = update_runs([(u.meta.run_id, u.values, u.guard) for u in updates])
    except Exception:
        logger.warning("kumiko_jobs: writing %d outcomes together failed; writing each alone", len(updates))
        counts = None
    for position, update in enumerate(updates):
        try:
            if counts is None:
                durable(update.mark_outcome)
            elif not counts[position]:
                safe(update.complete, counts[position])
        except StaleAttempt as exc:
            from kumiko_jobs.task_execution import forget_attempt

            log_stale(exc)
            forget_attempt(exc.run_id)
            stale.add(position)
    return stale


def log_stale(exc: StaleAttempt) -> None:
    logger.warning(
        "kumiko_jobs: %s; its attempt's outcome is not recorded, and the run is left to whoever "
        "holds it now (the attempt's worker stalled past its lease, or its record changed while "
        "the reaper decided)",
        exc,
    )


def _written_already(meta: JobMeta, values: dict[str, Any]) -> bool:
    """Whether the row holds this very write: a write that committed and lost its answer (the
    connection dropped) is sent again, and the guard then finds the row moved on by it.
    ``updated_at`` is the write's own moment."""
    written = JobRun.objects.using(router.db_for_write(JobRun))
    return written.filter(pk=meta.run_id, updated_at=values["updated_at"]).exists()


def _stale(meta: JobMeta) -> StaleAttempt:
    return StaleAttempt(meta.run_id, meta.attempt, status_of(meta.run_id) or "no row")


def mark_retry(
    *,
    meta: JobMeta,
    now: datetime,
    next_at: datetime,
    error: str,
    traceback: str,
    logs: list[LogLine],
    next_attempt: int,
    max_attempts: int,
    started: Started | None = None,
    reaping: bool = False,
) -> None:
    _finish(
        meta,
        started,
        reaping,
        status=RunStatus.QUEUED,
        attempt=next_attempt,
        max_attempts=max_attempts,
        next_attempt_at=next_at,
        updated_at=now,
        error=error,
        traceback=traceback,
        logs=_all_logs(meta, logs, now, force_merge=True),
    )


def mark_failed(
    *,
    meta: JobMeta,
    now: datetime,
    error: str,
    traceback: str,
    logs: list[LogLine],
    started: Started | None = None,
    reaping: bool = False,
) -> None:
    _finish(
        meta,
        started,
        reaping,
        status=RunStatus.FAILED,
        finished_at=now,
        updated_at=now,
        next_attempt_at=None,
        error=error,
        traceback=traceback,
        logs=_all_logs(meta, logs, now, force_merge=True),
    )


def mark_deferred(
    *, meta: JobMeta, now: datetime, next_at: datetime, logs: list[LogLine], started: Started | None = None
) -> None:
    _finish(
        meta,
        started,
        False,
        status=RunStatus.DEFERRED,
        next_attempt_at=next_at,
        defer_count=meta.defers + 1,
        updated_at=now,
        logs=_all_logs(meta, logs, now, force_merge=True),
    )


def _finish(meta: JobMeta, started: Started | None, reaping: bool, **values: Any) -> None:
    """Write an attempt's outcome. With ``started`` the row also gets the start (a worker may
    skip the separate "running" write for short runs), and is created if it is missing.
    ``reaping``: the reaper's write, which may find its own earlier write (module docstring)."""
    guard = _guard(meta, started, reaping)
    OutcomeUpdate(meta, started, guard, _with_start(meta, started, **values)).mark_outcome()


def _guard(meta: JobMeta, started: Started | None, reaping: bool = False) -> AttemptGuard:
    """An attempt's write condition. Without ``started`` (the reaper's, or an outcome whose start
    was written on its own) only an unfinished run is this attempt's."""
    if reaping:
        return AttemptGuard(meta.attempt + 1)
    return AttemptGuard(meta.attempt, None if started is None else started.at)


def _with_start(meta: JobMeta, started: Started | None, **values: Any) -> dict[str, Any]:
    """An outcome's values, with the attempt's start when the write records it too."""
    if started is None:
        return values
    values.setdefault("attempt", meta.attempt)
    return {"started_at": started.at, "worker": started.worker, "max_attempts": meta.max_attempts, **values}


def mark_requeued(
    *,
    meta: JobMeta,
    now: datetime,
    next_at: datetime | None,
    logs: list[LogLine],
    started: Started | None = None,
) -> None:
    """Back to queued without consuming an attempt (unknown job during a deploy, a lowered cap).
    With ``started``, a row the dispatcher has not written yet is created first."""
    values = {
        "status": RunStatus.QUEUED,
        "next_attempt_at": next_at,
        "updated_at": now,
        "attempt": meta.attempt,
        "max_attempts": meta.max_attempts,
        "logs": _all_logs(meta, logs, now, force_merge=True),
    }
    unfinished = Q(status__in=ACTIVE_STATUSES)
    if started is not None:
        unfinished |= Q(finished_at__lt=started.at)
    held = JobRun.objects.filter(unfinished, pk=meta.run_id, attempt__lte=meta.attempt)
    if held.update(**values) or _written_already(meta, values):
        return
    if started is not None:
        row = run_rows.new_run_row(meta=meta, job_id=started.job_id, payload=started.payload, queued_at=now)
        insert_queued([row])
        if held.update(**values):
            return
    elif status_of(meta.run_id) is None:
        return
    raise _stale(meta)


def mark_failed_without_row(*, job_id: str, run_id: str | None, now: datetime, error: str) -> None:
    """Malformed data: fail whatever row matches the job id or run id; log if none does."""
    query = JobRun.objects.filter(job_id=job_id)
    if run_id:
        try:
            query = JobRun.objects.filter(pk=uuid.UUID(run_id)) | query
        except ValueError:
            pass
    if not query.update(status=RunStatus.FAILED, finished_at=now, updated_at=now, error=error):
        logger.error("kumiko_jobs: malformed job %s has no run record: %s", job_id, error)


def _all_logs(meta: JobMeta, logs: list[LogLine], now: datetime, force_merge: bool = False) -> list[LogLine]:
    """The row's log lines with this attempt's appended, for the write made at ``now``."""
    # Earlier attempts' lines are kept; reading them back only when there can be any keeps
    # the common first-attempt success to one UPDATE.
    if not force_merge and meta.attempt == 1 and meta.defers == 0 and meta.abandons == 0:
        return logs
    row = JobRun.objects.filter(pk=meta.run_id).values_list("logs", "updated_at").first()
    if row is None:
        return logs
    previous, updated_at = row
    if updated_at == now:
        # This very write committed and lost its answer, and is built again to be sent again
        # (guarded_writes): its lines are in the row already, and appending them twice would
        # show the attempt's log twice (a deferral or a requeue passes the guard again).
        return list(previous or [])
    return [*(previous or []), *logs]
