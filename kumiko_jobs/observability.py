"""Tracing and correlation: W3C trace context travels in job meta; one span per execution."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import propagate, trace

if TYPE_CHECKING:
    from kumiko_jobs.context import JobContext

tracer = trace.get_tracer("kumiko_jobs")
_correlation: contextvars.ContextVar[str | None] = contextvars.ContextVar("kumiko_correlation", default=None)


def current_correlation_id() -> str | None:
    return _correlation.get()


@contextmanager
def correlation_scope(correlation_id: str | None) -> Iterator[None]:
    """Jobs dispatched inside inherit this correlation id (use it in a request middleware)."""
    token = _correlation.set(correlation_id)
    try:
        yield
    finally:
        _correlation.reset(token)


def current_trace_carrier() -> dict[str, str]:
    # Only a recording span has anything worth propagating; skip the work otherwise.
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextmanager
def job_span(ctx: JobContext, carrier: dict[str, str], consumer_lane: str) -> Iterator[trace.Span]:
    parent = propagate.extract(carrier) if carrier else None
    attributes: dict[str, str | int] = {
        "job.name": ctx.job_name,
        "job.id": ctx.job_id,
        "job.attempt": ctx.attempt,
        "kumiko.tenant_id": ctx.tenant_id or "",
        "kumiko.job.run_in": ctx.lane,
        "kumiko.job.consumer_lane": consumer_lane,
    }
    with (
        correlation_scope(ctx.correlation_id),
        tracer.start_as_current_span(
            "job.execute", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes
        ) as span,
    ):
        yield span
