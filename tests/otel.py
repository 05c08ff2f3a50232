"""The test process's OpenTelemetry SDK: one global tracer provider with an in-memory span
exporter and one meter provider with an in-memory reader (globals can be set once per process,
so every test shares them; fixtures clear or diff what they read)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

SPANS = InMemorySpanExporter()
READER = InMemoryMetricReader()


def install_sdk() -> None:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    if not getattr(provider, "_kumiko_test_exporter", False):
        provider.add_span_processor(SimpleSpanProcessor(SPANS))
        provider._kumiko_test_exporter = True  # type: ignore[attr-defined]
    if not isinstance(metrics.get_meter_provider(), MeterProvider):
        metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    install_sdk()
    SPANS.clear()
    yield SPANS
    SPANS.clear()


@pytest.fixture
def no_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if no SDK were installed: the API's get_tracer_provider() returns its proxy again."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)


def finished(exporter: InMemorySpanExporter, kind: trace.SpanKind) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind == kind]


def points(name: str) -> list[Any]:
    """The data points of instrument ``name`` in a fresh collection."""
    install_sdk()
    data = READER.get_metrics_data()
    found: list[Any] = []
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


def value(name: str, **attributes: str) -> float | None:
    """The value (sum/gauge) or count (histogram) of the point of ``name`` with exactly ``attributes``."""
    for point in points(name):
        if dict(point.attributes or {}) == attributes:
            return point.value if isinstance(point, NumberDataPoint) else point.count
    return None


def metric_unit(name: str) -> str | None:
    install_sdk()
    data = READER.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    return str(metric.unit)
    return None
