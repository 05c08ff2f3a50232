"""Tracing and correlation (observability.py): the dispatching span's context and the
correlation id travel with the job; each execution is a CONSUMER span in the same trace."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kumiko_jobs import dispatch
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.observability import correlation_scope, current_trace_carrier
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)
_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    # The global provider can be set once per process; every test shares it and clears it.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def test_no_active_span_means_no_carrier() -> None:
    assert current_trace_carrier() == {}


def test_execution_span_is_a_child_of_the_dispatching_span(
    spans: InMemorySpanExporter, tenants: list[Any], redis_client: Any, traces: Any
) -> None:
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("request") as request_span:
        result = dispatch("tests.record", {"n": 1}, tenant=tenants[0])
    meta = JobMeta.from_json(redis_client.hget(f"rq:job:{result.job_id}", "meta"))
    assert "traceparent" in meta.trace
    drain()
    [job_span] = [s for s in spans.get_finished_spans() if s.kind == trace.SpanKind.CONSUMER]
    assert job_span.context.trace_id == request_span.get_span_context().trace_id
    assert job_span.parent is not None and job_span.parent.span_id == request_span.get_span_context().span_id
    attributes = dict(job_span.attributes or {})
    assert attributes["kumiko.tenant_id"] == str(tenants[0].pk)
    assert attributes["kumiko.job.consumer_lane"] == "worker"


def test_correlation_id_of_the_scope_reaches_the_run(traces: Any) -> None:
    with correlation_scope("req-123"):
        dispatch("tests.record", {})
    drain()
    assert traces("record")[0]["corr"] == "req-123"
