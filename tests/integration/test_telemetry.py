"""Telemetry across processes: a request's trace continues in a real ``runjobs`` worker (its
spans read back from its console exporter, flushed when it stops), and the worker's metrics are
scraped from its Prometheus endpoint."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.integration.conftest import StartWorker
from tests.integration.support import WorkerProcess, wait_until
from tests.otel import finished, spans

__all__ = ["spans"]  # fixture
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def worker_spans(worker: WorkerProcess) -> list[dict[str, Any]]:
    """The spans a worker's console exporter wrote (project/telemetry.py: one JSON line each)."""
    return [json.loads(line) for line in worker.output().splitlines() if line.startswith('{"span"')]


def post_note(slug: str) -> tuple[str, str]:
    """The run id and job id of a note written through the demo's view."""
    response = Client().post(f"/demo/{slug}/notes/", {"text": "across processes"})
    assert response.status_code == 202
    return str(response.json()["run_id"]), str(response.json()["job_id"])


@pytest.mark.parametrize("stop", ["sigterm", "max_jobs"])
def test_the_request_trace_continues_in_the_worker_and_is_flushed_when_it_stops(
    spans: InMemorySpanExporter,
    start_worker: StartWorker,
    wait_for_run: Callable[..., Any],
    tenants: list[Any],
    stop: str,
) -> None:
    args = ("--max-jobs", "1") if stop == "max_jobs" else ()
    # A long export delay: the spans reach the output only because the worker flushes on exit.
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "600000"}
    worker = start_worker("worker", *args, env=env)
    run_id, job_id = post_note(tenants[0].slug)
    [request] = finished(spans, SpanKind.SERVER)
    [send] = finished(spans, SpanKind.PRODUCER)
    wait_for_run(run_id)
    if stop == "max_jobs":
        assert worker.wait(30) == 0
    else:
        assert worker.stop() == 0
    [process] = [s for s in worker_spans(worker) if s["kind"] == "CONSUMER"]
    assert process["span"].startswith("process ") and process["span"].endswith(":worker")
    assert process["trace_id"] == f"{request.context.trace_id:032x}" == f"{send.context.trace_id:032x}"
    assert process["parent_id"] == f"{send.context.span_id:016x}"
    assert process["attributes"]["messaging.message.id"] == job_id
    assert process["attributes"]["kumiko.job.consumer_lane"] == "worker"
    assert process["status"] == "UNSET"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_worker_serves_its_metrics_for_prometheus(
    start_worker: StartWorker, wait_for_run: Callable[..., Any], tenants: list[Any]
) -> None:
    port = free_port()
    env = {
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
    }
    start_worker("worker", env=env)
    wait_for_run(post_note(tenants[0].slug)[0])

    def scraped() -> str | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body: str = response.read().decode()
        return body if "kumiko_jobs_run_duration_seconds_count" in body else None

    body = wait_until(scraped, 10, "the worker's run duration metric")
    lines = body.splitlines()
    assert any(
        line.startswith("kumiko_jobs_run_duration_seconds_count{")
        and 'job="demo.write_note"' in line
        and 'outcome="succeeded"' in line
        and line.endswith(" 1.0")
        for line in lines
    ), body
    assert any(line.startswith("kumiko_jobs_last_success_seconds{") for line in lines), body
    assert any(line.startswith("kumiko_jobs_depth{") and 'state="running"' in line for line in lines), body
