"""Run one claimed job and decide its outcome; the worker applies the outcome in Redis.

Every path writes the run record before returning, so what Redis is told next never gets
ahead of the record (see records.py for why that order makes crashes repairable).
"""

from __future__ import annotations

import logging
import time
import traceback as tb
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from django.db import close_old_connections

from kumiko_jobs import records
from kumiko_jobs.audit import flush_audits
from kumiko_jobs.cap_fallback import current_flow_if_changed, defer_over_lowered_cap
from kumiko_jobs.conf import get_config
from kumiko_jobs.context import Deferral, JobContext, JobLogger
from kumiko_jobs.definitions import JobDefinition
from kumiko_jobs.dispatching import PER_TENANT_PREFIX
from kumiko_jobs.exceptions import MalformedJob, UnknownJob, UnrecoverableError
from kumiko_jobs.jobdata import JobMeta, decode_payload
from kumiko_jobs.observability import job_span
from kumiko_jobs.outcomes import ClaimedJob, Outcome
from kumiko_jobs.registry import registry
from kumiko_jobs.tenancy import get_activator
from kumiko_jobs.timeouts import enforce_timeout

logger = logging.getLogger("kumiko_jobs")


class RunObserver(Protocol):
    """How a worker records that a run started: ``started`` when it does, ``finishing`` right
    before its outcome is written (nothing may record the start after that)."""

    def started(self, meta: JobMeta, start: records.Started) -> None: ...

    def finishing(self) -> None: ...


class RecordStartAtOnce:
    """Write "running" before the handler runs (drain(), boot gates)."""

    def started(self, meta: JobMeta, start: records.Started) -> None:
        records.safe(
            records.mark_running, meta=meta, job_id=start.job_id, payload=start.payload, worker=start.worker,
            now=start.at,
        )  # fmt: skip

    def finishing(self) -> None:
        pass


def run_claimed(
    job: ClaimedJob, *, worker: str, consumer_lane: str, observer: RunObserver | None = None
) -> Outcome:
    """Decode, execute and record one claimed job. Never raises for job errors."""
    now = datetime.now(UTC)
    try:
        meta = JobMeta.from_json(job.meta_raw)
    except MalformedJob as exc:
        return _malformed(job.job_id, None, now, exc)
    outcome = _run(job, meta, now, worker=worker, consumer_lane=consumer_lane, observer=observer)
    outcome.flow, outcome.limit_keys = meta.flow, meta.limit_keys
    if not outcome.current_flow:
        outcome.current_flow = current_flow_if_changed(registry.find(meta.job_name), meta)
    return outcome


def _run(
    job: ClaimedJob,
    meta: JobMeta,
    now: datetime,
    *,
    worker: str,
    consumer_lane: str,
    observer: RunObserver | None,
) -> Outcome:
    try:
        payload = decode_payload(job.data)
    except MalformedJob as exc:
        return _malformed(job.job_id, meta.run_id, now, exc)
    if meta.job_name.startswith(PER_TENANT_PREFIX):
        from kumiko_jobs.fanout import run_fan_out

        return run_fan_out(job.job_id, meta, payload, worker=worker, consumer_lane=consumer_lane)
    definition = registry.find(meta.job_name)
    if definition is None:
        return unknown_job_outcome(job.job_id, meta, now)
    held_back = defer_over_lowered_cap(definition, meta)
    if held_back is not None:
        return held_back
    start = records.Started(job_id=job.job_id, payload=payload, worker=worker, at=now)
    observer = observer or RecordStartAtOnce()
    observer.started(meta, start)
    return execute(
        definition, job.job_id, meta, payload, consumer_lane=consumer_lane, start=start, observer=observer
    )


def execute(
    definition: JobDefinition,
    job_id: str,
    meta: JobMeta,
    payload: dict[str, Any],
    *,
    consumer_lane: str,
    start: records.Started,
    observer: RunObserver,
    inline: bool = False,
) -> Outcome:
    """Run the handler and record its outcome; ``inline`` runs (boot gates) cannot defer."""
    final = meta.attempt >= meta.max_attempts
    log = JobLogger(definition.name, meta.attempt)
    ctx = JobContext(
        job_name=definition.name,
        run_id=meta.run_id,
        job_id=job_id,
        tenant_id=meta.tenant_id,
        attempt=meta.attempt,
        final_attempt=final,
        triggered_by=meta.triggered_by,
        trigger_name=meta.trigger_name,
        correlation_id=meta.correlation_id,
        lane=meta.lane,
        definition=definition,
        log=log,
        inline=inline,
        scheduled_at=None if meta.scheduled_at is None else datetime.fromtimestamp(meta.scheduled_at, UTC),
    )
    try:
        with (
            job_span(ctx, meta.trace, consumer_lane),
            get_activator()(meta.tenant_id),
            enforce_timeout(definition.timeout, definition.name),
        ):
            result = definition.func(payload, ctx)
        error: Exception | None = None
    except Exception as exc:
        error = exc
    finally:
        observer.finishing()
        if ctx.audit_uses:
            flush_audits(ctx)
        # Long-lived workers must not keep a broken or expired DB connection between jobs.
        close_old_connections()
    if error is not None:
        return failed_attempt(definition, job_id, meta, error, log.lines, start=start)
    now = datetime.now(UTC)
    if isinstance(result, Deferral):
        return _deferred(definition, job_id, meta, result, now, log.lines, start)
    records.safe(records.mark_succeeded, meta=meta, now=now, logs=log.lines, started=start)
    return Outcome("ok", ttl=int(get_config()["RESULT_TTL"]), counted_as="succeeded")


def failed_attempt(
    definition: JobDefinition | None,
    job_id: str,
    meta: JobMeta,
    exc: BaseException,
    logs: list[dict[str, Any]],
    *,
    extra_attempts: int = 0,
    start: records.Started | None = None,
) -> Outcome:
    """One failed attempt: retry (with backoff) if attempts remain, else fail finally."""
    now = datetime.now(UTC)
    message = f"{exc.__class__.__name__}: {exc}"
    trace_text = "".join(tb.format_exception(exc))
    max_attempts = meta.max_attempts + extra_attempts
    final = isinstance(exc, UnrecoverableError | UnknownJob) or meta.attempt >= max_attempts
    # One line per failed attempt; never the payload (it may carry personal data).
    logger.error(
        "kumiko_jobs: job failed: %s job_id=%s attempt=%s final=%s error=%s",
        meta.job_name,
        job_id,
        meta.attempt,
        final,
        message,
        extra={"job": meta.job_name, "job_id": job_id, "attempt": meta.attempt, "final": final},
    )
    logs = [*logs, {"t": now.isoformat(), "level": "error", "msg": message, "attempt": meta.attempt}]
    if final:
        records.safe(
            records.mark_failed,
            meta=meta,
            now=now,
            error=message,
            traceback=trace_text,
            logs=logs,
            started=start,
        )
        return Outcome(
            "failed",
            meta=meta.to_json(),
            exc_info=zlib.compress(trace_text.encode()),
            ttl=int(get_config()["FAILURE_TTL"]),
            counted_as="failed",
        )
    delay = definition.retry_delay(meta.attempt) if definition else 0.0
    next_meta = JobMeta(**{**meta.__dict__, "attempt": meta.attempt + 1, "max_attempts": max_attempts})
    next_at = now + timedelta(seconds=delay)
    records.safe(
        records.mark_retry,
        meta=meta,
        now=now,
        next_at=next_at,
        error=message,
        traceback=trace_text,
        logs=logs,
        next_attempt=next_meta.attempt,
        max_attempts=max_attempts,
        started=start,
    )
    if delay <= 0:
        return Outcome("requeue", meta=next_meta.to_json(), counted_as="retried")
    return Outcome("retry", meta=next_meta.to_json(), retry_at=time.time() + delay, counted_as="retried")


def _deferred(
    definition: JobDefinition,
    job_id: str,
    meta: JobMeta,
    deferral: Deferral,
    now: datetime,
    logs: list[dict[str, Any]],
    start: records.Started,
) -> Outcome:
    if meta.defers >= definition.max_defers:
        error = UnrecoverableError(
            f"Job {definition.name!r} was deferred {definition.max_defers} times (max_defers); giving up."
        )
        return failed_attempt(definition, job_id, meta, error, logs, start=start)
    next_at = now + timedelta(milliseconds=deferral.delay_ms)
    records.safe(records.mark_deferred, meta=meta, now=now, next_at=next_at, logs=logs, started=start)
    next_meta = JobMeta(**{**meta.__dict__, "defers": meta.defers + 1})
    return Outcome("retry", meta=next_meta.to_json(), retry_at=next_at.timestamp(), counted_as="deferred")


def unknown_job_outcome(job_id: str, meta: JobMeta, now: datetime) -> Outcome:
    """A name this deploy does not know: retry for a grace period (rolling deploy), then fail."""
    config = get_config()
    first_seen = meta.unknown_since or now.timestamp()
    if now.timestamp() - first_seen < float(config["UNKNOWN_JOB_GRACE"]):
        delay = float(config["UNKNOWN_JOB_RETRY_DELAY"])
        message = (
            f"Unknown job {meta.job_name!r} on worker of this deploy; retrying in {delay:g}s "
            f"(gives up {config['UNKNOWN_JOB_GRACE']}s after first seen)."
        )
        logger.warning("kumiko_jobs: %s job_id=%s", message, job_id)
        next_at = now + timedelta(seconds=delay)
        line = {"t": now.isoformat(), "level": "warning", "msg": message, "attempt": meta.attempt}
        records.safe(records.mark_requeued, meta=meta, now=now, next_at=next_at, logs=[line])
        next_meta = JobMeta(**{**meta.__dict__, "unknown_since": first_seen})
        return Outcome(
            "retry", meta=next_meta.to_json(), retry_at=now.timestamp() + delay, counted_as="requeued"
        )
    exc = UnknownJob(meta.job_name, [])
    return failed_attempt(None, job_id, meta, exc, [])


def _malformed(job_id: str, run_id: str | None, now: datetime, exc: MalformedJob) -> Outcome:
    message = f"Malformed job data, cannot run it: {exc}"
    logger.error("kumiko_jobs: %s job_id=%s", message, job_id)
    records.safe(records.mark_failed_without_row, job_id=job_id, run_id=run_id, now=now, error=message)
    return Outcome(
        "failed",
        exc_info=zlib.compress(message.encode()),
        ttl=int(get_config()["FAILURE_TTL"]),
        counted_as="failed",
    )


def perform_rq_job(job_name: str, payload: dict[str, Any]) -> None:
    """Entry point named in every job hash; only kumiko's lane workers may run kumiko jobs."""
    raise RuntimeError(
        f"Job {job_name!r} was picked up by a plain RQ worker. Run kumiko jobs with "
        "`python manage.py runjobs --lane api|worker`, which records runs and applies retries."
    )
