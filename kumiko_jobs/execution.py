"""Run one claimed job: decode it, route it (fan-out wrapper, unknown job, lowered cap) and run
its handler inside its tenant, span and timeout. The outcome policy lives in outcomes.py.

A plain handler runs under the SIGALRM timeout (timeouts.py), an ``async def`` one on the
thread's event loop with the timeout as a cancellation (async_handlers.py). A Django task's
runner (task_execution.py) enforces its task's timeout itself, its function may be either.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
from datetime import UTC, datetime
from typing import Any, Protocol

from kumiko_jobs import attempt_records, outcomes, put_back
from kumiko_jobs.async_handlers import run_coroutine
from kumiko_jobs.audit import flush_audits
from kumiko_jobs.cap_fallback import defer_over_lowered_cap
from kumiko_jobs.context import Deferral, JobContext, JobLogger
from kumiko_jobs.db_connections import open_transactions, tidy_after_job
from kumiko_jobs.definitions import JobDefinition, wrapped_job
from kumiko_jobs.exceptions import MalformedJob
from kumiko_jobs.fanout import run_fan_out
from kumiko_jobs.jobdata import JobMeta, decode_payload
from kumiko_jobs.lane import ClaimedJob
from kumiko_jobs.observability import correlation_scope, processing, record_outcome
from kumiko_jobs.outcomes import Outcome, Settle
from kumiko_jobs.registry import registry
from kumiko_jobs.run_marker import mark_running
from kumiko_jobs.tenancy import activation
from kumiko_jobs.timeouts import enforce_timeout


class RunObserver(Protocol):
    """How a worker records that a run started: ``started`` when it does, ``finishing`` right
    before its outcome is written (nothing may record the start after that). ``finishing``
    says whether the start was recorded (and job_started sent) on its own; if not, the outcome
    write records it and the outcome policy announces it. ``settle``: when a success is written
    and said (outcomes.Settle)."""

    settle: Settle

    def started(self, meta: JobMeta, start: attempt_records.Started) -> None: ...

    def finishing(self) -> bool: ...


class RecordStartAtOnce:
    """Write "running" before the handler runs (drain(), boot gates)."""

    settle: Settle = "now"

    def started(self, meta: JobMeta, start: attempt_records.Started) -> None:
        mark_running(meta, start)

    def finishing(self) -> bool:
        return True


def run_claimed(
    job: ClaimedJob, *, worker: str, consumer_lane: str, observer: RunObserver | None = None
) -> Outcome:
    """Decode, execute and record one claimed job, inside its process span. Never raises for
    job errors."""
    try:
        meta = JobMeta.from_json(job.meta_raw)
    except MalformedJob as exc:
        return outcomes.malformed(job.job_id, None, exc)
    with processing(meta, job.job_id, consumer_lane) as span:
        outcome = _route(job, meta, worker=worker, consumer_lane=consumer_lane, observer=observer)
        record_outcome(span, outcome.counted_as)
    return outcome


def _route(
    job: ClaimedJob, meta: JobMeta, *, worker: str, consumer_lane: str, observer: RunObserver | None
) -> Outcome:
    try:
        payload = decode_payload(job.data)
    except MalformedJob as exc:
        return outcomes.malformed(job.job_id, meta.run_id, exc, outcomes.release_of(None, meta))
    start = attempt_records.Started(job_id=job.job_id, payload=payload, worker=worker, at=datetime.now(UTC))
    target = wrapped_job(meta.job_name)
    if target is not None:
        return run_fan_out(meta, start, target)
    definition = registry.find(meta.job_name)
    if definition is None:
        return put_back.unknown_job(meta, meta.job_name, start)
    held_back = defer_over_lowered_cap(definition, meta, start)
    if held_back is not None:
        return held_back
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
    start: attempt_records.Started,
    observer: RunObserver,
    inline: bool = False,
) -> Outcome:
    """Run the handler and record its outcome; ``inline`` runs (boot gates) cannot defer."""
    log = JobLogger(definition.name, meta.attempt)
    ctx = JobContext(
        job_name=definition.name,
        run_id=meta.run_id,
        job_id=job_id,
        tenant_id=meta.tenant_id,
        attempt=meta.attempt,
        final_attempt=meta.attempt >= meta.max_attempts,
        triggered_by=meta.triggered_by,
        trigger_name=meta.trigger_name,
        correlation_id=meta.correlation_id,
        lane=meta.lane,
        definition=definition,
        log=log,
        inline=inline,
        scheduled_at=None if meta.scheduled_at is None else datetime.fromtimestamp(meta.scheduled_at, UTC),
        worker=start.worker,
    )
    callers = open_transactions()
    try:
        with correlation_scope(ctx.correlation_id), activation(meta.tenant_id):
            # In a copy of the context, as an async handler's coroutine is: what a handler sets
            # in context variables (translation.activate, a logging library's bound fields)
            # must not carry over to the next job on this thread, another tenant's.
            result = contextvars.copy_context().run(call_handler, definition, payload, ctx)
        error: BaseException | None = None
    except Exception as exc:
        error = exc
    except SystemExit as exc:
        if definition.task is None:
            raise
        # Django's tasks framework records a task's SystemExit as a failure of the task. (A
        # second SIGTERM lands here too: the attempt fails, and the worker stops after it.)
        error = exc
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        # asyncio.CancelledError out of async_to_sync, GeneratorExit, a library's own
        # BaseException: the attempt fails with it. Escaping, it killed the job thread, and the
        # run was retried as abandoned until its extra attempts ran out.
        error = exc
    finally:
        if observer.finishing():
            start = dataclasses.replace(start, announced=True)
        # The next job must not inherit a broken connection or a transaction this one left open;
        # nor may the audit: written inside a transaction the handler left open, it was rolled
        # back with it.
        tidy_after_job(callers)
        if ctx.audit_uses:
            flush_audits(ctx)
    if error is not None:
        return outcomes.failed_attempt(definition, job_id, meta, error, log.lines, start=start)
    if isinstance(result, Deferral):
        return outcomes.deferred(definition, job_id, meta, result.delay_ms, log.lines, start)
    # Only a task's return value is kept (checked JSON by its runner); a job's is ignored.
    returned = result if definition.task is not None else None
    return outcomes.succeeded(
        definition, job_id, meta, log.lines, start, result=returned, settle=observer.settle
    )


def call_handler(definition: JobDefinition, payload: dict[str, Any], ctx: JobContext) -> Any:
    """Call the handler within the job's timeout: async handlers on this thread's event loop."""
    if definition.task is not None:
        return definition.func(payload, ctx)  # the task runner enforces the timeout itself
    if inspect.iscoroutinefunction(definition.func):
        return run_coroutine(
            definition.func, (payload, ctx), timeout=definition.timeout, job_name=definition.name
        )
    with enforce_timeout(definition.timeout, definition.name):
        result = definition.func(payload, ctx)
    if inspect.isawaitable(result):
        # A callable that is not a coroutine function but returns one (a class with an async
        # __call__, a sync decorator around an async def): awaited, not recorded as a success
        # of code that never ran.
        return run_coroutine(_awaited, (result,), timeout=definition.timeout, job_name=definition.name)
    return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def perform_rq_job(job_name: str, payload: dict[str, Any]) -> None:
    """Entry point named in every job hash; only kumiko's lane workers may run kumiko jobs."""
    raise RuntimeError(
        f"Job {job_name!r} was picked up by a plain RQ worker. Run kumiko jobs with "
        "`python manage.py runjobs --lane api|worker`, which records runs and applies retries."
    )
