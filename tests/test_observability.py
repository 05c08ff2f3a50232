"""Traces (observability.py) with the SDK's in-memory exporter: the send span of a dispatch,
the process span of each attempt, their attributes, links for retries and deferrals, errors."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from django.db import transaction
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import messaging_attributes as messaging
from opentelemetry.semconv.attributes import error_attributes, exception_attributes
from opentelemetry.trace import SpanKind, StatusCode

from kumiko_jobs import dispatch, observability
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.exceptions import QueueUnavailable
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.models import JobRun
from kumiko_jobs.observability import correlation_scope, current_trace_carrier, new_trace
from kumiko_jobs.testing import drain
from tests.otel import finished, no_sdk, spans

__all__ = ["no_sdk", "spans"]  # fixtures
pytestmark = pytest.mark.django_db(transaction=True)
tracer = trace.get_tracer("tests")


def only(exporter: InMemorySpanExporter, kind: SpanKind) -> ReadableSpan:
    [span] = finished(exporter, kind)
    return span


def job_of(span: ReadableSpan) -> str:
    return str(dict(span.attributes or {}).get("kumiko.job.name"))


def test_attribute_names_are_the_semantic_conventions() -> None:
    # The package needs only opentelemetry-api, so it spells the names itself.
    assert observability.MESSAGING_SYSTEM == messaging.MESSAGING_SYSTEM
    assert observability.MESSAGING_OPERATION_TYPE == messaging.MESSAGING_OPERATION_TYPE
    assert observability.MESSAGING_OPERATION_NAME == messaging.MESSAGING_OPERATION_NAME
    assert observability.MESSAGING_DESTINATION_NAME == messaging.MESSAGING_DESTINATION_NAME
    assert observability.MESSAGING_MESSAGE_ID == messaging.MESSAGING_MESSAGE_ID
    assert observability.MESSAGING_BATCH_MESSAGE_COUNT == messaging.MESSAGING_BATCH_MESSAGE_COUNT
    assert observability.SEND == messaging.MessagingOperationTypeValues.SEND.value
    assert observability.PROCESS == messaging.MessagingOperationTypeValues.PROCESS.value
    assert observability.ERROR_TYPE == error_attributes.ERROR_TYPE
    assert observability.EXCEPTION_TYPE == exception_attributes.EXCEPTION_TYPE
    assert observability.EXCEPTION_MESSAGE == exception_attributes.EXCEPTION_MESSAGE
    assert observability.EXCEPTION_STACKTRACE == exception_attributes.EXCEPTION_STACKTRACE


def test_request_send_and_process_share_one_trace_with_every_attribute(
    spans: InMemorySpanExporter, tenants: list[Any], redis_client: Any
) -> None:
    tenant = str(tenants[0].pk)
    queue = get_keys().queue_name("worker")
    with tracer.start_as_current_span("request") as request, correlation_scope("req-7"):
        result = dispatch("tests.record", {"n": 1}, tenant=tenant)
    send = only(spans, SpanKind.PRODUCER)
    assert send.name == f"send {queue}"
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "kumiko_jobs",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": queue,
        "messaging.message.id": result.job_id,
        "kumiko.job.name": "tests.record",
        "kumiko.tenant_id": tenant,
        "kumiko.job.lane": "worker",
        "kumiko.job.attempt": 1,
        "kumiko.run_id": result.run_id,
        "kumiko.correlation_id": "req-7",
        "kumiko.dispatch.status": "queued",
    }
    # The job carries the send span's context, not the request's.
    meta = JobMeta.from_json(redis_client.hget(f"rq:job:{result.job_id}", "meta"))
    assert meta.trace["traceparent"].split("-")[2] == f"{send.context.span_id:016x}"

    assert drain() == {"succeeded": 1}
    process = only(spans, SpanKind.CONSUMER)
    assert process.name == f"process {queue}"
    assert process.context.trace_id == request.get_span_context().trace_id == send.context.trace_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert not process.links
    assert process.status.status_code == StatusCode.UNSET
    assert dict(process.attributes or {}) == {
        "messaging.system": "kumiko_jobs",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": queue,
        "messaging.message.id": result.job_id,
        "kumiko.job.name": "tests.record",
        "kumiko.tenant_id": tenant,
        "kumiko.job.attempt": 1,
        "kumiko.job.lane": "worker",
        "kumiko.job.consumer_lane": "worker",
        "kumiko.job.outcome": "succeeded",
    }


def test_inside_atomic_the_send_span_is_made_at_commit_under_the_dispatching_span(
    spans: InMemorySpanExporter,
) -> None:
    with transaction.atomic():
        with tracer.start_as_current_span("request") as request:
            dispatch("tests.record", {})
        assert finished(spans, SpanKind.PRODUCER) == []  # nothing pushed before the commit
    send = only(spans, SpanKind.PRODUCER)
    # Made after the request span ended, still its child: the context travelled with the row.
    request_span = next(s for s in spans.get_finished_spans() if s.name == "request")
    assert send.start_time is not None and request_span.end_time is not None
    assert send.start_time >= request_span.end_time
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id


def test_rollback_makes_no_send_span(spans: InMemorySpanExporter) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        dispatch("tests.record", {})
        raise RuntimeError("roll back")
    assert finished(spans, SpanKind.PRODUCER) == []


def test_a_failing_attempt_is_an_error_and_its_retry_a_linked_new_trace(
    spans: InMemorySpanExporter,
) -> None:
    dispatch("tests.flaky", {"succeed_on": 2, "mail": "ann@example.com"})
    send = only(spans, SpanKind.PRODUCER)
    assert drain() == {"retried": 1, "succeeded": 1}
    first, second = sorted(finished(spans, SpanKind.CONSUMER), key=lambda s: s.start_time or 0)
    attributes = dict(first.attributes or {})
    assert attributes["kumiko.job.attempt"] == 1 and attributes["kumiko.job.outcome"] == "retried"
    assert first.status.status_code == StatusCode.ERROR
    assert first.status.description == "RuntimeError: flaky failure on attempt 1"
    assert attributes["error.type"] == "RuntimeError"
    [event] = first.events
    assert event.name == "exception"
    assert dict(event.attributes or {})["exception.type"] == "RuntimeError"
    assert "flaky failure on attempt 1" in str(dict(event.attributes or {})["exception.stacktrace"])
    assert first.parent is not None and first.parent.span_id == send.context.span_id
    # Attempt 2 is not nested under the send span that ended a while ago: a new trace, linked.
    assert dict(second.attributes or {})["kumiko.job.attempt"] == 2
    assert second.parent is None and second.context.trace_id != send.context.trace_id
    assert [link.context.span_id for link in second.links] == [send.context.span_id]
    assert second.status.status_code == StatusCode.UNSET


def test_final_failure_is_an_error_with_a_qualified_error_type(spans: InMemorySpanExporter) -> None:
    dispatch("tests.unrecoverable", {})
    drain()
    process = only(spans, SpanKind.CONSUMER)
    assert process.status.status_code == StatusCode.ERROR
    assert dict(process.attributes or {})["error.type"] == "kumiko_jobs.exceptions.UnrecoverableError"
    assert dict(process.attributes or {})["kumiko.job.outcome"] == "failed"


def test_the_error_on_a_span_is_scrubbed(spans: InMemorySpanExporter) -> None:
    dispatch("tests.raise_secret", {})
    drain()
    process = only(spans, SpanKind.CONSUMER)
    text = f"{process.status.description} {dict(process.events[0].attributes or {})}"
    assert "ann@example.com" not in text and "hunter2" not in text
    assert "[email]" in text and "[redacted]" in text


def test_a_deferred_run_comes_back_as_a_linked_new_trace(spans: InMemorySpanExporter) -> None:
    dispatch("tests.defer", {"times": 1, "ms": 10})
    send = only(spans, SpanKind.PRODUCER)
    drain()
    first, second = sorted(finished(spans, SpanKind.CONSUMER), key=lambda s: s.start_time or 0)
    assert dict(first.attributes or {})["kumiko.job.outcome"] == "deferred"
    assert first.status.status_code == StatusCode.UNSET
    assert first.parent is not None and first.parent.span_id == send.context.span_id
    assert second.parent is None and [link.context.span_id for link in second.links] == [send.context.span_id]


def test_a_chained_job_is_a_child_of_its_parent_run_and_keeps_the_correlation_id(
    spans: InMemorySpanExporter, traces: Any
) -> None:
    with correlation_scope("req-chain"):
        dispatch("tests.chain", {})
    drain()
    chain_process = next(s for s in finished(spans, SpanKind.CONSUMER) if job_of(s) == "tests.chain")
    child_send = next(s for s in finished(spans, SpanKind.PRODUCER) if job_of(s) == "tests.record")
    assert child_send.parent is not None and child_send.parent.span_id == chain_process.context.span_id
    assert traces("record")[0]["corr"] == "req-chain"
    assert traces("chain")[0]["corr"] == "req-chain"


def test_new_trace_starts_a_root_send_span_linked_to_the_current_span(spans: InMemorySpanExporter) -> None:
    with tracer.start_as_current_span("scheduler loop") as loop, new_trace():
        dispatch("tests.record", {})
    send = only(spans, SpanKind.PRODUCER)
    assert send.parent is None
    assert send.context.trace_id != loop.get_span_context().trace_id
    assert [link.context.span_id for link in send.links] == [loop.get_span_context().span_id]
    drain()
    assert only(spans, SpanKind.CONSUMER).parent.span_id == send.context.span_id  # type: ignore[union-attr]


def test_a_fan_out_is_one_batch_send_span_under_the_wrapper(
    spans: InMemorySpanExporter, tenants: list[Any]
) -> None:
    dispatch("tests.per_tenant", {})
    drain()
    wrapper = next(s for s in finished(spans, SpanKind.CONSUMER) if job_of(s).startswith("_"))
    batch = next(s for s in finished(spans, SpanKind.PRODUCER) if s.parent is not None)
    assert batch.parent is not None and batch.parent.span_id == wrapper.context.span_id
    attributes = dict(batch.attributes or {})
    assert attributes["messaging.batch.message_count"] == len(tenants)
    assert "messaging.message.id" not in attributes and "kumiko.tenant_id" not in attributes
    children = [s for s in finished(spans, SpanKind.CONSUMER) if s is not wrapper]
    assert len(children) == len(tenants)
    assert {s.parent.span_id for s in children if s.parent} == {batch.context.span_id}


def test_redis_down_makes_the_send_span_an_error(spans: InMemorySpanExporter, settings: Any) -> None:
    dead = {"REDIS_URL": "redis://:pw@127.0.0.1:1/0", "REDIS_TIMEOUT": 0.5}
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, **dead}
    with pytest.raises(QueueUnavailable):
        dispatch("tests.record", {})
    send = only(spans, SpanKind.PRODUCER)
    assert send.status.status_code == StatusCode.ERROR
    assert dict(send.attributes or {})["error.type"] == "kumiko_jobs.exceptions.QueueUnavailable"
    assert "pw@" not in str(send.status.description)


@pytest.mark.parametrize(("named", "enabled"), [("sdk_tracer_provider", "True"), (None, "False")])
def test_a_provider_named_in_the_environment_at_start_up_turns_tracing_on(
    named: str | None, enabled: str
) -> None:
    """tracing_enabled() reads the API's global, and OTEL_PYTHON_TRACER_PROVIDER once, when the
    process starts (that is when the variable is set): named there, the API loads that provider."""
    env = {k: v for k, v in os.environ.items() if k != "OTEL_PYTHON_TRACER_PROVIDER"}
    if named:
        env["OTEL_PYTHON_TRACER_PROVIDER"] = named
    code = "from kumiko_jobs import observability; print(observability.tracing_enabled())"
    ran = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == enabled


@pytest.mark.usefixtures("no_sdk")
def test_without_an_sdk_nothing_is_traced_or_copied() -> None:
    assert not observability.tracing_enabled()
    with trace.get_tracer("tests without an sdk").start_as_current_span("request"):
        assert current_trace_carrier() == {}
        result = dispatch("tests.record", {})
    from kumiko_jobs.preparing import prepare
    from kumiko_jobs.registry import registry

    prepared = [prepare(registry.get("tests.record"), {}, tenant_id=None, user_id=None)]
    with observability.sending(prepared) as send:
        assert send.jobs is prepared
    with observability.processing(prepared[0].meta, prepared[0].job_id, "worker") as span:
        assert span is None
    assert drain() == {"succeeded": 1}
    assert JobRun.objects.get(pk=result.run_id).status == "succeeded"


def test_correlation_id_of_the_scope_reaches_the_run(traces: Any) -> None:
    with correlation_scope("req-123"):
        result = dispatch("tests.record", {})
    drain()
    assert traces("record")[0]["corr"] == "req-123"
    assert JobRun.objects.get(pk=result.run_id).correlation_id == "req-123"


def test_a_success_said_after_the_lane_step_is_said_in_its_attempts_trace(
    spans: InMemorySpanExporter,
) -> None:
    # A worker's writer says a success after its process span ended (outcomes.py,
    # settle="by_writer"): its receivers still run in that span's context, so what they dispatch
    # joins the trace.
    from kumiko_jobs import signals
    from kumiko_jobs.attempt_records import write_outcomes
    from kumiko_jobs.execution import RecordStartAtOnce, run_claimed
    from kumiko_jobs.lane import Claim, Finished, finish_and_claim

    class SettlingLater(RecordStartAtOnce):
        settle = "by_writer"

    def follow_up(sender: str, run: signals.RunInfo, **extra: Any) -> None:
        dispatch("tests.api_record", {"n": "follow-up"})

    dispatch("tests.record", {})
    client, keys = get_redis(), get_keys()
    job = finish_and_claim(client, keys, "worker", claim=Claim("tests", "x", 9e9))
    assert job is not None
    signals.job_succeeded.connect(follow_up, sender="tests.record", weak=False)
    try:
        outcome = run_claimed(job, worker="tests", consumer_lane="worker", observer=SettlingLater())
        assert outcome.settle is not None and outcome.update is not None
        write_outcomes([outcome.update])  # as the writer thread does
        finish_and_claim(client, keys, "worker", Finished(job.job_id, f"{job.job_id}:x", outcome))
        assert not any(job_of(s) == "tests.api_record" for s in finished(spans, SpanKind.PRODUCER))
        outcome.settle()
    finally:
        signals.job_succeeded.disconnect(follow_up, sender="tests.record")
    process = only(spans, SpanKind.CONSUMER)
    [send] = [s for s in finished(spans, SpanKind.PRODUCER) if job_of(s) == "tests.api_record"]
    assert send.parent is not None and send.parent.span_id == process.context.span_id
    assert send.context.trace_id == process.context.trace_id
