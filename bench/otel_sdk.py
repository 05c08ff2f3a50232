"""The OpenTelemetry SDK set-ups the observability bench compares (bench/settings.py installs
one in a child when KUMIKO_BENCH_OTEL asks)."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class DroppingExporter(SpanExporter):
    """Receives every batch and keeps nothing: the in-process side of exporting, without a network."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def install(*, exporting: bool) -> None:
    tracer_provider = TracerProvider()
    readers: list[MetricReader] = []
    if exporting:
        tracer_provider.add_span_processor(BatchSpanProcessor(DroppingExporter()))
        # Aggregates every measurement, as a reader does between exports; never collected here.
        readers.append(InMemoryMetricReader())
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=readers))
