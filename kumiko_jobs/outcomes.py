"""How an attempt ended: the outcome policy (retry, fail, defer, requeue) and what Redis is told.

Every policy function writes the run record first and then returns the ``Outcome`` the worker
applies in Redis (lane.finish_and_claim), so what Redis is told never gets ahead of the record
(attempt_records.py explains why that order makes crashes repairable).

One exception, for the worker's hot path: with ``settle="by_writer"`` (a worker's job loops) a
success's UPDATE is built, not sent (``Outcome.update``); the worker's writer thread writes it
with other successes, then tells Redis, then calls ``Outcome.settle`` to say it (log line,
metrics, signals; success_writes.py). The job loop takes its next job at once. The order holds:
the record is written before Redis is told.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback as tb
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from kumiko_jobs import attempt_records, failure_records, guarded_writes, run_events
from kumiko_jobs.conf import get_config
from kumiko_jobs.connection import get_keys
from kumiko_jobs.context import cut_line
from kumiko_jobs.definitions import JobDefinition
from kumiko_jobs.exceptions import (
    MalformedJob,
    StaleAttempt,
    UnknownJob,
    UnrecoverableError,
    is_final,
    text_of,
)
from kumiko_jobs.flows import cap_of
from kumiko_jobs.gates import gates_for
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.observability import in_this_context, record_failure
from kumiko_jobs.registry import registry
from kumiko_jobs.scrubbing import scrub
from kumiko_jobs.validation import storable_text

logger = logging.getLogger("kumiko_jobs")

# "": nothing to record in Redis (a reaped run whose hash is gone only gives back its cap slot).
# "return": a claimed job that never started, back at the front of its flow (claiming.py).
# "stale": an attempt whose run moved on (see ``stale``): Redis is told nothing of it.
OutcomeKind = Literal["ok", "failed", "retry", "requeue", "return", "stale", ""]
LogLine = dict[str, Any]
# When a success is written and said (see the module docstring).
Settle = Literal["now", "by_writer"]


@dataclass(frozen=True)
class Release:
    """What a finished attempt gives back in Redis: its flow's cap slot and its skip limits."""

    flow: str = ""
    limit_keys: str = ""
    # The job's flow under this deploy, when a deploy changed its cap since the run was queued.
    current_flow: str = ""


@dataclass(frozen=True)
class Outcome:
    """What the worker tells Redis about a finished attempt (see scripts.FinishAndClaimArgs)."""

    kind: OutcomeKind
    counted_as: str  # succeeded | failed | retried | deferred | requeued | returned
    release: Release = Release()
    meta: str = ""  # the run's next meta ('' keeps it)
    retry_at: float = 0.0
    exc_info: bytes = b""
    ttl: int = 0
    # Whose attempt it was, for the lane's hourly counters ('' for data that is not a job).
    job_name: str = ""
    tenant_id: str | None = None
    # What is left of a success left settling: wait for its record write (if not by_writer),
    # then say it. The worker calls it once, right after telling Redis; None when nothing is left.
    settle: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    # A by_writer success's record write, for the worker's writer thread.
    update: attempt_records.OutcomeUpdate | None = field(default=None, compare=False, repr=False)


def release_of(definition: JobDefinition | None, meta: JobMeta) -> Release:
    return Release(meta.flow, meta.limit_keys, current_flow_if_changed(definition, meta))


def current_flow_if_changed(definition: JobDefinition | None, meta: JobMeta) -> str:
    """The job's flow under this deploy when it is a capped one that differs from the run's."""
    if definition is None or cap_of(meta.flow) is None:
        return ""
    flow = gates_for(definition, meta.tenant_id, get_keys()).flow
    return flow if flow != meta.flow else ""


def succeeded(
    definition: JobDefinition | None,
    job_id: str,
    meta: JobMeta,
    logs: list[LogLine],
    start: attempt_records.Started | None,
    *,
    result: Any = None,
    settle: Settle = "now",
) -> Outcome:
    """``result``: what a Django task returned (stored on the run); None for jobs.
    ``settle``: when the success is written and said (see the module docstring)."""
    now = datetime.now(UTC)
    update = None
    if settle == "by_writer":
        update = attempt_records.prepare_succeeded(
            meta=meta, now=now, logs=logs, started=start, result=result
        )
    else:
        try:
            guarded_writes.durable(
                attempt_records.mark_succeeded, meta=meta, now=now, logs=logs, started=start, result=result
            )
        except StaleAttempt as moved:
            return stale(moved)

    def say() -> None:
        if definition is not None and definition.tenant_visible_failure is not None and meta.tenant_id:
            # A success clears the tenant's failure record of the same subject.
            guarded_writes.safe(
                failure_records.clear_tenant_failure, meta.tenant_id, meta.job_name, meta.subject
            )
        started_at = start.at if start else None
        run_events.attempt_ended(meta, job_id, "succeeded", started_at=started_at, final=True, ended_at=now)
        _announce_start(meta, job_id, start)
        run_events.succeeded(meta, job_id)

    if settle == "now":
        say()
    return Outcome(
        "ok",
        "succeeded",
        release_of(definition, meta),
        ttl=int(get_config()["RESULT_TTL"]),
        settle=None if settle == "now" else in_this_context(say),
        update=update,
        **_whose(meta),
    )


def given_back(job_id: str, meta_raw: bytes) -> Outcome:
    """A claimed job that never started (a stopping worker's ready job): back to the front of its
    flow, its cap slot freed, no attempt used, its record untouched."""
    try:
        meta = JobMeta.from_json(meta_raw)
    except MalformedJob:
        return Outcome("return", "returned")  # the script reads its flow from the job hash
    return Outcome("return", "returned", release_of(registry.find(meta.job_name), meta))


def failed_attempt(
    definition: JobDefinition | None,
    job_id: str,
    meta: JobMeta,
    exc: BaseException,
    logs: list[LogLine],
    *,
    extra_attempts: int = 0,
    start: attempt_records.Started | None = None,
    reaping: bool = False,
) -> Outcome:
    """One failed attempt: retry (with backoff) if attempts remain, else fail finally.
    ``reaping``: the reaper's outcome of an abandoned attempt (attempt_records.py)."""
    now = datetime.now(UTC)
    # Scrubbed before anything stores or logs them: run record, Redis, span, log line.
    message = storable_text(scrub(f"{exc.__class__.__name__}: {text_of(exc)}"))
    trace_text = storable_text(scrub("".join(tb.format_exception(exc))))
    record_failure(exc, message, trace_text)
    max_attempts = meta.max_attempts + extra_attempts
    final = is_final(exc) or isinstance(exc, UnknownJob) or meta.attempt >= max_attempts
    # The record's error and traceback keep the whole text; its log line, which every attempt
    # adds and each retry reads back, is cut as ctx.log lines are.
    line: LogLine = {
        "t": now.isoformat(),
        "level": "error",
        "msg": cut_line(message),
        "attempt": meta.attempt,
    }
    # Which exception and worker, per failed attempt: a Django task's errors and worker ids
    # are read back from these lines (task_results.py).
    line["exception"] = f"{type(exc).__module__}.{type(exc).__qualname__}"
    if start is not None:
        line["worker"] = start.worker
    logs = [*logs, line]
    release = release_of(definition, meta)
    started_at = start.at if start else None
    if final:
        try:
            guarded_writes.durable(
                attempt_records.mark_failed,
                meta=meta,
                now=now,
                error=message,
                traceback=trace_text,
                logs=logs,
                started=start,
                reaping=reaping,
            )
        except StaleAttempt as moved:
            return stale(moved)
        _record_tenant_failure(definition, meta, exc, now)
        # One line per failed attempt; never the payload (it may carry personal data).
        run_events.attempt_ended(
            meta, job_id, "failed", started_at=started_at, final=True, error=message, exc=exc
        )
        _announce_start(meta, job_id, start)
        run_events.failed(meta, job_id, final=True, error=message)
        return Outcome(
            "failed",
            "failed",
            release,
            meta=meta.to_json(),
            exc_info=zlib.compress(trace_text.encode()),
            ttl=int(get_config()["FAILURE_TTL"]),
            **_whose(meta),
        )
    delay = definition.retry_delay(meta.attempt) if definition else 0.0
    next_meta = dataclasses.replace(meta, attempt=meta.attempt + 1, max_attempts=max_attempts)
    try:
        guarded_writes.durable(
            attempt_records.mark_retry,
            meta=meta,
            now=now,
            next_at=now + timedelta(seconds=delay),
            error=message,
            traceback=trace_text,
            logs=logs,
            next_attempt=next_meta.attempt,
            max_attempts=max_attempts,
            started=start,
            reaping=reaping,
        )
    except StaleAttempt as moved:
        return stale(moved)
    run_events.attempt_ended(meta, job_id, "retried", started_at=started_at, error=message, exc=exc)
    _announce_start(meta, job_id, start)
    run_events.failed(meta, job_id, final=False, error=message)
    if delay <= 0:
        return Outcome("requeue", "retried", release, meta=next_meta.to_json(), **_whose(meta))
    return Outcome(
        "retry", "retried", release, meta=next_meta.to_json(), retry_at=time.time() + delay, **_whose(meta)
    )


def deferred(
    definition: JobDefinition,
    job_id: str,
    meta: JobMeta,
    delay_ms: int,
    logs: list[LogLine],
    start: attempt_records.Started,
) -> Outcome:
    """The handler returned ``ctx.defer(ms)``: run again later with the same attempt."""
    if meta.defers >= definition.max_defers:
        error = UnrecoverableError(
            f"Job {definition.name!r} was deferred {definition.max_defers} times (max_defers); giving up."
        )
        return failed_attempt(definition, job_id, meta, error, logs, start=start)
    now = datetime.now(UTC)
    next_at = now + timedelta(milliseconds=delay_ms)
    try:
        guarded_writes.durable(
            attempt_records.mark_deferred, meta=meta, now=now, next_at=next_at, logs=logs, started=start
        )
    except StaleAttempt as moved:
        return stale(moved)
    run_events.attempt_ended(meta, job_id, "deferred", started_at=start.at, deferral="handler")
    _announce_start(meta, job_id, start)
    run_events.deferred(meta, job_id)
    next_meta = dataclasses.replace(meta, defers=meta.defers + 1)
    return Outcome(
        "retry",
        "deferred",
        release_of(definition, meta),
        meta=next_meta.to_json(),
        retry_at=next_at.timestamp(),
        **_whose(meta),
    )


def _whose(meta: JobMeta) -> dict[str, Any]:
    return {"job_name": meta.job_name, "tenant_id": meta.tenant_id}


def _announce_start(meta: JobMeta, job_id: str, start: attempt_records.Started | None) -> None:
    """A short run's start is recorded with its outcome, so job_started goes out with it."""
    if start is not None and not start.announced:
        run_events.started(meta, job_id)


def _record_tenant_failure(
    definition: JobDefinition | None, meta: JobMeta, exc: BaseException, now: datetime
) -> None:
    declared = definition.tenant_visible_failure if definition is not None else None
    if declared is None or not meta.tenant_id:
        return  # not declared, or a system run: no tenant to tell
    # The error's own key when it carries one (a project's "user-facing" exceptions), else the
    # declaration's. Never the error text.
    own = getattr(exc, "message_key", None)
    key = own if isinstance(own, str) and own.strip() else declared.message_key
    guarded_writes.safe(
        failure_records.record_tenant_failure,
        tenant_id=meta.tenant_id,
        job_name=meta.job_name,
        subject=meta.subject,
        message_key=key[:200],
        run_id=meta.run_id,
        now=now,
    )


def stale(exc: StaleAttempt) -> Outcome:
    """An attempt whose record write found the run moved on (its worker stalled past its lease:
    the reaper retried or failed the run, another worker may have run it since). Nothing was
    recorded or said; Redis is told nothing either (lane.step leaves it out), so its lease,
    which the worker stops renewing, stays with the reaper if it still holds the run."""
    from kumiko_jobs.task_execution import forget_attempt

    attempt_records.log_stale(exc)
    forget_attempt(exc.run_id)
    return Outcome("stale", "stale")


def recorded_outcome(definition: JobDefinition | None, meta: JobMeta, status: str) -> Outcome:
    """What Redis is told about a run whose record already says how it ended (its worker wrote
    the record, then died before telling Redis): nothing is written or run again."""
    release = release_of(definition, meta)
    if status == "succeeded":
        return Outcome("ok", "succeeded", release, ttl=int(get_config()["RESULT_TTL"]))
    return Outcome("failed", status, release, ttl=int(get_config()["FAILURE_TTL"]))


def malformed(job_id: str, run_id: str | None, exc: MalformedJob, release: Release = Release()) -> Outcome:
    """Data that is not a kumiko job: fail it into the failed registry, never run it."""
    message = scrub(f"Malformed job data, cannot run it: {exc}")
    logger.error("kumiko_jobs: %s job_id=%s", message, job_id)
    now = datetime.now(UTC)
    guarded_writes.safe(
        attempt_records.mark_failed_without_row, job_id=job_id, run_id=run_id, now=now, error=message
    )
    return Outcome(
        "failed",
        "failed",
        release,
        exc_info=zlib.compress(message.encode()),
        ttl=int(get_config()["FAILURE_TTL"]),
    )
