"""OpenTelemetry for the demo project: the SDK, exporters chosen by the standard ``OTEL_*``
environment variables, and Django request spans (``opentelemetry-instrumentation-django``).

kumiko_jobs itself needs only ``opentelemetry-api``; installing an SDK and exporters is the
project's choice, and this module is the demo's. Variables (unset: ``DEMO_TELEMETRY`` in
settings, console spans and Prometheus metrics in the demo):

- ``OTEL_TRACES_EXPORTER``: ``console`` (one JSON line per span on stdout), ``otlp``
  (http/protobuf to ``OTEL_EXPORTER_OTLP_ENDPOINT``, default http://localhost:4318) or ``none``.
- ``OTEL_METRICS_EXPORTER``: ``prometheus`` (the web process serves ``/metrics``; a process with
  ``OTEL_EXPORTER_PROMETHEUS_PORT`` set also serves them on ``OTEL_EXPORTER_PROMETHEUS_HOST``
  (default localhost) and that port: the demo command sets it for its workers), ``otlp``,
  ``console`` or ``none``. Several may be given, comma-separated.
- ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``: the resource; ``OTEL_SDK_DISABLED=true``
  installs nothing. ``OTEL_PYTHON_DJANGO_EXCLUDED_URLS`` (default ``metrics``): no request spans.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import IO

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

logger = logging.getLogger("project.telemetry")
TRACES = ("console", "otlp", "none")
METRICS = ("prometheus", "otlp", "console", "none")
_configured = False


class _Stdout:
    """Where console spans go: this process's stdout, looked up at each write (so a terminal
    UI that redirects stdout still shows them), or a file (``console_to``)."""

    target: IO[str] | None = None

    def write(self, text: str) -> int:
        return (self.target or sys.stdout).write(text)

    def flush(self) -> None:
        (self.target or sys.stdout).flush()


CONSOLE = _Stdout()


def span_line(span: ReadableSpan) -> str:
    """One span as one JSON line: readable in a log, and parseable by a test."""
    context, parent = span.get_span_context(), span.parent
    line = {
        "span": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}" if context else None,
        "span_id": f"{context.span_id:016x}" if context else None,
        "parent_id": f"{parent.span_id:016x}" if parent else None,
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "status": span.status.status_code.name,
        "ms": round((span.end_time - span.start_time) / 1e6, 3)
        if span.end_time and span.start_time
        else None,
        "attributes": dict(span.attributes or {}),
    }
    return json.dumps(line, default=str) + "\n"


def configure() -> None:
    """Install the SDK providers and request spans once per process (from DemoConfig.ready)."""
    global _configured
    if _configured:
        return
    _configured = True
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return
    defaults = getattr(settings, "DEMO_TELEMETRY", {})
    resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME", "kumiko-demo")})
    traces = _names("OTEL_TRACES_EXPORTER", defaults.get("traces", "none"), TRACES)
    exporters = [_span_exporter(name) for name in traces if name != "none"]
    if exporters:
        tracer_provider = TracerProvider(resource=resource)
        for exporter in exporters:
            tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
    names = _names("OTEL_METRICS_EXPORTER", defaults.get("metrics", "none"), METRICS)
    readers = [_metric_reader(name) for name in names if name != "none"]
    if readers:
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    DjangoInstrumentor().instrument(
        excluded_urls=os.environ.get("OTEL_PYTHON_DJANGO_EXCLUDED_URLS", "metrics")
    )


def prometheus_enabled() -> bool:
    defaults = getattr(settings, "DEMO_TELEMETRY", {})
    return "prometheus" in _names("OTEL_METRICS_EXPORTER", defaults.get("metrics", "none"), METRICS)


def console_to(stream: IO[str] | None) -> None:
    """Send console spans to ``stream`` (None: stdout again); the demo command keeps them out
    of its progress display this way."""
    CONSOLE.target = stream


def _names(variable: str, default: str, known: Sequence[str]) -> list[str]:
    names = [n.strip().lower() for n in os.environ.get(variable, default).split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ImproperlyConfigured(f"{variable}={','.join(names)}: the demo knows {', '.join(known)}.")
    return names


def _span_exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter(out=CONSOLE, formatter=span_line)  # type: ignore[arg-type]
    _require_http_protobuf()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _metric_reader(name: str) -> MetricReader:
    if name == "console":
        return PeriodicExportingMetricReader(ConsoleMetricExporter(out=CONSOLE))  # type: ignore[arg-type]
    if name == "otlp":
        _require_http_protobuf()
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return PeriodicExportingMetricReader(OTLPMetricExporter())
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    reader = PrometheusMetricReader()
    port = os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT")
    if port:
        _serve_prometheus(os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost"), int(port))
    return reader


def _serve_prometheus(host: str, port: int) -> None:
    from prometheus_client import start_http_server

    try:
        start_http_server(port, addr=host)
    except OSError as exc:
        logger.warning(
            "metrics not served on %s:%d (%s); set another OTEL_EXPORTER_PROMETHEUS_PORT", host, port, exc
        )


def _require_http_protobuf() -> None:
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    if protocol != "http/protobuf":
        raise ImproperlyConfigured(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: the demo ships the http/protobuf exporter only "
            "(install opentelemetry-exporter-otlp-proto-grpc and change project/telemetry.py for grpc)."
        )


def prometheus_text() -> tuple[bytes, str]:
    """This process's metrics in Prometheus' text format, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
