"""Traces after the OpenTelemetry messaging conventions, and the correlation id.

- Dispatch: a PRODUCER span ``send <prefix>:<lane>`` per push to Redis (one per push call: a
  fan-out batch is one span with ``messaging.batch.message_count``). Inside
  ``transaction.atomic()`` the push, and so the span, happens at commit; its parent is the
  context that was current when ``dispatch()`` was called (the request's span), carried in
  ``JobMeta.trace`` from ``prepare()`` to the push. The push replaces that carrier with the send
  span's own context, which travels with the job (W3C ``traceparent``).
- Execution: a CONSUMER span ``process <prefix>:<lane>`` per attempt, a child of the send span
  on the first delivery. Retries (attempt > 1), deferrals and requeues start a new trace with a
  span link to the send span, instead of nesting under a parent that ended long ago.
- ``new_trace()``: dispatches inside it start a new trace whose send span links to the span
  current at that moment (for schedulers: a cron tick is not a child of a long-lived span).

Without an SDK (the API's proxy or no-op provider) none of this does any work beyond one
``isinstance`` per push and per attempt. The package needs only ``opentelemetry-api``: the
attribute names below are the semantic conventions' (tests compare them with
``opentelemetry-semantic-conventions``), not imported from it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from kumiko_jobs.connection import get_keys
from kumiko_jobs.exceptions import text_of
from kumiko_jobs.jobdata import JobMeta, with_meta
from kumiko_jobs.scrubbing import scrub

if TYPE_CHECKING:
    from kumiko_jobs.pushing import PreparedJob, Pushed

logger = logging.getLogger("kumiko_jobs")
tracer = trace.get_tracer("kumiko_jobs")

# Semantic-convention attribute names (messaging, error, exception).
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_DESTINATION_NAME = "messaging.destination.name"
MESSAGING_MESSAGE_ID = "messaging.message.id"
MESSAGING_BATCH_MESSAGE_COUNT = "messaging.batch.message_count"
ERROR_TYPE = "error.type"
EXCEPTION_TYPE = "exception.type"
EXCEPTION_MESSAGE = "exception.message"
EXCEPTION_STACKTRACE = "exception.stacktrace"
SEND = "send"
PROCESS = "process"
SYSTEM = "kumiko_jobs"
# kumiko's own attributes (DESIGN.md part 2, Observability), plus run id, correlation id and
# what became of the attempt or the push.
JOB_NAME = "kumiko.job.name"
TENANT_ID = "kumiko.tenant_id"
JOB_ATTEMPT = "kumiko.job.attempt"
JOB_LANE = "kumiko.job.lane"
CONSUMER_LANE = "kumiko.job.consumer_lane"
RUN_ID = "kumiko.run_id"
CORRELATION_ID = "kumiko.correlation_id"
JOB_OUTCOME = "kumiko.job.outcome"
DISPATCH_STATUS = "kumiko.dispatch.status"

# Carrier keys of a context to link to rather than to descend from (new_trace()).
LINK_PREFIX = "link."
_NO_TRACER = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_ASK_THE_API = object()
_PROVIDER_FROM_ENV = OTEL_PYTHON_TRACER_PROVIDER in os.environ
_new_trace: contextvars.ContextVar[bool] = contextvars.ContextVar("kumiko_new_trace", default=False)
_correlation: contextvars.ContextVar[str | None] = contextvars.ContextVar("kumiko_correlation", default=None)
Attributes = dict[str, str | int]


def tracing_enabled() -> bool:
    """True when an SDK tracer provider is installed (only then are spans worth making)."""
    # The API's global, as set_tracer_provider() sets it, read here because
    # get_tracer_provider() looks up OTEL_PYTHON_TRACER_PROVIDER in the environment on every
    # call while none is set: a KeyError inside os.environ, ~1 us, a third of the hooks' cost
    # per attempt without an SDK. The variable is read once, at start-up (_PROVIDER_FROM_ENV);
    # where it names a provider, or the API has no such global, the API is asked.
    provider = getattr(trace, "_TRACER_PROVIDER", _ASK_THE_API)
    if provider is None:
        if not _PROVIDER_FROM_ENV:
            return False
        provider = trace.get_tracer_provider()
    elif provider is _ASK_THE_API:
        provider = trace.get_tracer_provider()
    # type() rather than isinstance(): these are ABCs, whose isinstance is several times slower.
    return type(provider) not in _NO_TRACER


def in_this_context(func: Callable[[], None]) -> Callable[[], None]:
    """``func``, to be called later with the OpenTelemetry context current now: a success the
    worker says after its process span ended (outcomes.py) keeps the span's ids on its log line
    and its receivers' spans (a job they dispatch) in the attempt's trace."""
    context = otel_context.get_current()
    if not context:  # nothing current to carry (always so without an SDK)
        return func

    def within() -> None:
        token = otel_context.attach(context)
        try:
            func()
        finally:
            otel_context.detach(token)

    return within


# Correlation ---------------------------------------------------------------------------------
def current_correlation_id() -> str | None:
    return _correlation.get()


@contextmanager
def correlation_scope(correlation_id: str | None) -> Iterator[None]:
    """Jobs dispatched inside inherit this correlation id (CorrelationMiddleware uses it)."""
    token = _correlation.set(correlation_id)
    try:
        yield
    finally:
        _correlation.reset(token)


# Producer side ---------------------------------------------------------------------------------
@contextmanager
def new_trace() -> Iterator[None]:
    """Dispatches made inside start a new trace, linked to the span current now (if any).

    For work that is not caused by the current span in a way worth nesting: a scheduler's cron
    ticks (``with new_trace(): fire(...)``), boot jobs, a loop under a long-lived span.
    """
    token = _new_trace.set(True)
    try:
        yield
    finally:
        _new_trace.reset(token)


def current_trace_carrier() -> dict[str, str]:
    """The context a dispatch made now descends from (or, under ``new_trace()``, links to), as
    carrier keys for ``JobMeta.trace``; empty when no span is current."""
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if _new_trace.get():
        return {LINK_PREFIX + key: value for key, value in carrier.items()}
    return carrier


class Send:
    """One push's send span: ``jobs`` carry its context; ``pushed()`` notes what Redis said."""

    def __init__(self, jobs: Sequence[PreparedJob], span: trace.Span | None = None) -> None:
        self.jobs = jobs
        self._span = span

    def pushed(self, outcomes: Sequence[Pushed]) -> None:
        if self._span is not None and len(outcomes) == 1 and self._span.is_recording():
            self._span.set_attribute(DISPATCH_STATUS, outcomes[0].status)


@contextmanager
def sending(prepared: Sequence[PreparedJob]) -> Iterator[Send]:
    """The send span around one push of ``prepared`` (jobs of one dispatch, emit or batch).

    Yields copies of the jobs whose meta carries the span's context; push those. A Redis error
    leaves the span with status ERROR.
    """
    if not prepared or not tracing_enabled():
        yield Send(prepared)
        return
    parent, links = _parent_and_links(prepared[0].meta.trace)
    span = tracer.start_span(
        _span_name(SEND, {p.lane for p in prepared}),
        context=parent,
        kind=SpanKind.PRODUCER,
        links=links,
        attributes=_send_attributes(prepared),
    )
    with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        try:
            yield Send([_with_trace(p, carrier) for p in prepared], span)
        except Exception as exc:
            _mark_error(span, exc, scrub(text_of(exc)))
            raise


def _with_trace(p: PreparedJob, carrier: dict[str, str]) -> PreparedJob:
    meta = dataclasses.replace(p.meta, trace=carrier)
    return dataclasses.replace(p, meta=meta, fields=with_meta(p.fields, meta))


def _send_attributes(prepared: Sequence[PreparedJob]) -> Attributes:
    first = prepared[0].meta
    attributes: Attributes = {
        MESSAGING_SYSTEM: SYSTEM,
        MESSAGING_OPERATION_TYPE: SEND,
        MESSAGING_OPERATION_NAME: SEND,
    }
    lanes = {p.lane for p in prepared}
    if len(lanes) == 1:
        attributes[MESSAGING_DESTINATION_NAME] = get_keys().queue_name(first.lane)
        attributes[JOB_LANE] = first.lane
    if len(prepared) > 1:
        attributes[MESSAGING_BATCH_MESSAGE_COUNT] = len(prepared)
    else:
        attributes[MESSAGING_MESSAGE_ID] = prepared[0].job_id
        attributes[RUN_ID] = first.run_id
        attributes[JOB_ATTEMPT] = first.attempt
    if all(p.meta.job_name == first.job_name for p in prepared):
        attributes[JOB_NAME] = first.job_name
    if first.tenant_id is not None and all(p.meta.tenant_id == first.tenant_id for p in prepared):
        attributes[TENANT_ID] = first.tenant_id
    if first.correlation_id:
        attributes[CORRELATION_ID] = first.correlation_id
    return attributes


# Consumer side ---------------------------------------------------------------------------------
def processing(meta: JobMeta, job_id: str, consumer_lane: str) -> AbstractContextManager[trace.Span | None]:
    """The process span of one attempt, current while it runs (None without an SDK). The outcome
    policy marks it failed (``record_failure``); the caller names the outcome
    (``record_outcome``). The run id and correlation id are on the send span; this one carries
    the job id (``messaging.message.id``), which the admin finds too."""
    if not tracing_enabled():
        return _NOT_TRACED
    return _Processing(meta, job_id, consumer_lane)


_NOT_TRACED: AbstractContextManager[None] = nullcontext(None)


class _Processing:
    """A class, not a generator-based context manager: this is on every attempt's path."""

    __slots__ = ("_span", "_token")

    def __init__(self, meta: JobMeta, job_id: str, consumer_lane: str) -> None:
        parent, links = _parent_and_links(meta.trace)
        if meta.attempt > 1 or meta.defers or meta.cap_defers or meta.unknown_since:
            # Not the first delivery: a new trace linked to the send span, not a child of a
            # span that ended long ago.
            links = [*links, *_links_to(parent)]
            parent = otel_context.Context()
        queue = get_keys().queue_name(consumer_lane)
        attributes: Attributes = {
            MESSAGING_SYSTEM: SYSTEM,
            MESSAGING_OPERATION_TYPE: PROCESS,
            MESSAGING_OPERATION_NAME: PROCESS,
            MESSAGING_DESTINATION_NAME: queue,
            MESSAGING_MESSAGE_ID: job_id,
            JOB_NAME: meta.job_name,
            JOB_ATTEMPT: meta.attempt,
            JOB_LANE: meta.lane,
            CONSUMER_LANE: consumer_lane,
        }
        if meta.tenant_id is not None:
            attributes[TENANT_ID] = meta.tenant_id
        self._span = tracer.start_span(
            f"{PROCESS} {queue}", context=parent, kind=SpanKind.CONSUMER, links=links, attributes=attributes
        )
        self._token: object = None

    def __enter__(self) -> trace.Span:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            if isinstance(exc, Exception):  # a bug of ours: the policy turns job errors into outcomes
                _mark_error(self._span, exc, scrub(text_of(exc)))
        finally:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._span.end()


def record_outcome(span: trace.Span | None, outcome: str) -> None:
    if span is not None and span.is_recording():
        span.set_attribute(JOB_OUTCOME, outcome)


def record_failure(exc: BaseException, message: str, trace_text: str) -> None:
    """Mark the current span (the attempt's process span) failed: status ERROR, ``error.type``
    and an exception event with the scrubbed message and traceback."""
    span = trace.get_current_span()
    if span.is_recording():
        _mark_error(span, exc, message, trace_text)


def _mark_error(span: trace.Span, exc: BaseException, message: str, trace_text: str | None = None) -> None:
    if not span.is_recording():
        return
    kind = error_type(exc)
    span.set_status(Status(StatusCode.ERROR, message))
    span.set_attribute(ERROR_TYPE, kind)
    event: Attributes = {EXCEPTION_TYPE: kind, EXCEPTION_MESSAGE: message}
    if trace_text:
        event[EXCEPTION_STACKTRACE] = trace_text
    span.add_event("exception", event)


def error_type(exc: BaseException) -> str:
    """The exception's fully qualified class name (``builtins`` left out), as ``error.type``."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


# Shared --------------------------------------------------------------------------------------
def _span_name(operation: str, lanes: set[str]) -> str:
    return f"{operation} {get_keys().queue_name(next(iter(lanes)))}" if len(lanes) == 1 else operation


def _parent_and_links(carrier: Mapping[str, str]) -> tuple[otel_context.Context | None, list[Link]]:
    """The parent context (None: the current one) and links a ``JobMeta.trace`` carrier names."""
    if not carrier:
        return None, []
    plain = {k: v for k, v in carrier.items() if not k.startswith(LINK_PREFIX)}
    linked = {k[len(LINK_PREFIX) :]: v for k, v in carrier.items() if k.startswith(LINK_PREFIX)}
    links = _links_to(propagate.extract(linked)) if linked else []
    if plain:
        return propagate.extract(plain), links
    # Link only: a new root, whatever span is current where the push happens.
    return otel_context.Context(), links


def _links_to(context: otel_context.Context | None) -> list[Link]:
    if context is None:
        return []
    span_context = trace.get_current_span(context).get_span_context()
    return [Link(span_context)] if span_context.is_valid else []


def flush_telemetry(timeout_millis: int = 5000) -> None:
    """Export what the SDK's tracer and meter providers hold (a worker calls this before it
    exits); nothing without an SDK. Never raises."""
    providers: list[Any] = [trace.get_tracer_provider(), metrics.get_meter_provider()]
    for provider in providers:
        force_flush = getattr(provider, "force_flush", None)
        if callable(force_flush):
            try:
                force_flush(timeout_millis)
            except Exception:
                logger.warning("kumiko_jobs: flushing telemetry failed", exc_info=True)
