"""The demo's telemetry (project/telemetry.py): DjangoInstrumentor's request span is the parent
of the dispatch's send span, whose child is the job's process span; /metrics for Prometheus."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from kumiko_jobs.conf import redis_url
from kumiko_jobs.models import JobRun
from kumiko_jobs.testing import drain
from project import telemetry
from tests.integration.support import database_url
from tests.otel import finished, spans

__all__ = ["spans"]  # fixture
pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent


def test_request_send_and_process_share_one_trace(spans: InMemorySpanExporter, tenants: list[Any]) -> None:
    response = Client().post(f"/demo/{tenants[0].slug}/notes/", {"text": "traced"})
    assert response.status_code == 202
    [request] = finished(spans, SpanKind.SERVER)
    assert request.name == "POST demo/<slug:slug>/notes/"
    [send] = finished(spans, SpanKind.PRODUCER)
    assert drain() == {"succeeded": 1}
    [process] = finished(spans, SpanKind.CONSUMER)
    assert request.context.trace_id == send.context.trace_id == process.context.trace_id
    assert send.parent is not None and send.parent.span_id == request.context.span_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    run = JobRun.objects.get(pk=response.json()["run_id"])
    assert dict(send.attributes or {})["kumiko.correlation_id"] == run.correlation_id
    assert dict(process.attributes or {})["messaging.message.id"] == run.job_id


def test_span_line_is_one_json_line_per_span(spans: InMemorySpanExporter) -> None:
    import json

    from opentelemetry import trace

    with (
        trace.get_tracer("tests").start_as_current_span("outer"),
        trace.get_tracer("tests").start_as_current_span("inner"),
    ):
        pass
    inner, outer = spans.get_finished_spans()
    line = telemetry.span_line(inner)
    assert line.endswith("\n") and line.count("\n") == 1
    parsed = json.loads(line)
    assert parsed["span"] == "inner" and parsed["parent_id"] == f"{outer.context.span_id:016x}"
    assert parsed["trace_id"] == f"{outer.context.trace_id:032x}"


PROBE = """
import django
django.setup()
from django.db import connection
from django.test import Client
from kumiko_jobs import dispatch
dispatch("tests.record", {})
response = Client().get("/metrics")
print(response.status_code, response.headers["Content-Type"])
print(response.content.decode())
"""


def test_metrics_endpoint_serves_prometheus_text(kumiko_prefix: str) -> None:
    # A process of its own: the demo's configure() installs the global meter provider once.
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "KUMIKO_QUEUE_PREFIX": kumiko_prefix,
        "KUMIKO_REDIS_URL": redis_url(),
        "OTEL_METRICS_EXPORTER": "prometheus",
        "DATABASE_URL": database_url(connection.settings_dict),  # this test's database
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    status, body = out.split("\n", 1)
    assert status.startswith("200 text/plain")
    assert "# TYPE kumiko_jobs_depth gauge" in body
    # The exporter adds otel_scope_* labels between ours.
    assert re.search(r'kumiko_jobs_depth\{lane="worker",[^}]*state="queued"\} 1\.0', body), body
