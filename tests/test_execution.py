"""Execution paths through drain(): the same code the lane worker runs, in-process."""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from kumiko_jobs import EscapeHatchDenied, dispatch
from kumiko_jobs.attempt_records import Started
from kumiko_jobs.connection import get_keys
from kumiko_jobs.context import MAX_LOG_LINE_CHARS, MAX_LOG_LINES, JobContext, JobLogger
from kumiko_jobs.fanout import child_job_id
from kumiko_jobs.models import EscapeHatchAudit, JobRun, RunStatus
from kumiko_jobs.preparing import prepare
from kumiko_jobs.pushing import push
from kumiko_jobs.registry import registry
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def test_retries_carry_attempt_and_final_attempt(traces: Any) -> None:
    result = dispatch("tests.flaky", {"succeed_on": 3})
    assert drain() == {"retried": 2, "succeeded": 1}
    assert [(e["attempt"], e["final"]) for e in traces("flaky")] == [(1, False), (2, False), (3, True)]
    # Exponential backoff with delay_ms=50: gaps of at least 50 ms, then 100 ms.
    times = [e["t"] for e in traces("flaky")]
    assert times[1] - times[0] >= 0.05
    assert times[2] - times[1] >= 0.10
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.attempt, run.max_attempts) == (RunStatus.SUCCEEDED, 3, 3)
    errors = [line["msg"] for line in run.logs if line["level"] == "error"]
    assert errors == ["RuntimeError: flaky failure on attempt 1", "RuntimeError: flaky failure on attempt 2"]


def test_final_failure_after_all_attempts(traces: Any, caplog: pytest.LogCaptureFixture) -> None:
    result = dispatch("tests.flaky", {"succeed_on": 99, "secret": "s3cr3t"})
    assert drain() == {"retried": 2, "failed": 1}
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.attempt) == (RunStatus.FAILED, 3)
    assert run.error == "RuntimeError: flaky failure on attempt 3"
    assert "Traceback" in run.traceback and run.finished_at is not None
    failed_lines = [r for r in caplog.records if getattr(r, "outcome", None) in ("retried", "failed")]
    assert [(r.attempt, r.final) for r in failed_lines] == [(1, False), (2, False), (3, True)]  # type: ignore[attr-defined]
    assert all("s3cr3t" not in r.getMessage() for r in caplog.records)


def test_unrecoverable_error_fails_at_once(traces: Any, redis_client: Any) -> None:
    result = dispatch("tests.unrecoverable", {})
    assert drain() == {"failed": 1}
    assert len(traces("unrecoverable")) == 1
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.attempt, run.error) == ("failed", 1, "UnrecoverableError: this cannot work")
    assert redis_client.zscore(get_keys().failed("worker"), result.job_id) is not None


def test_timeout_stops_the_handler_and_retries(traces: Any) -> None:
    result = dispatch("tests.slow", {"seconds": 3})
    assert drain() == {"retried": 1, "failed": 1}
    assert len(traces("slow_start")) == 2 and traces("slow_end") == []
    run = JobRun.objects.get(pk=result.run_id)
    assert "exceeded its timeout of 0.5s" in run.error


def test_defer_reruns_with_same_attempt(traces: Any) -> None:
    result = dispatch("tests.defer", {"times": 2, "ms": 30})
    assert drain() == {"deferred": 2, "succeeded": 1}
    entries = traces("defer")
    assert [e["attempt"] for e in entries] == [1, 1, 1]
    assert entries[1]["t"] - entries[0]["t"] >= 0.03
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.defer_count, run.attempt) == ("succeeded", 2, 1)


def test_more_deferrals_than_max_defers_fail_naming_the_cap() -> None:
    result = dispatch("tests.defer", {"times": 3, "ms": 10})
    assert drain() == {"deferred": 2, "failed": 1}
    run = JobRun.objects.get(pk=result.run_id)
    assert run.status == "failed"
    assert "deferred 2 times (max_defers)" in run.error


def test_defer_needs_positive_integer_delay() -> None:
    ctx = _context("tests.defer")
    for bad in (0, -5, 1.5, True, "10"):
        with pytest.raises(ValueError, match="positive integer delay"):
            ctx.defer(bad)  # type: ignore[arg-type]
    inline = dataclasses.replace(ctx, inline=True)
    with pytest.raises(RuntimeError, match="not available inline"):
        inline.defer(10)
    # A unit mistake overflowed the retry time after the handler returned, killing the worker.
    with pytest.raises(ValueError, match="over a year"):
        ctx.defer(10**15)


def test_unknown_job_in_queue_is_retried_during_grace_then_fails(settings: Any, redis_client: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "UNKNOWN_JOB_GRACE": 0.3, "UNKNOWN_JOB_RETRY_DELAY": 0.1}
    future = dataclasses.replace(registry.get("tests.record"), name="tests.from_the_future")
    prepared = prepare(future, {}, tenant_id=None, user_id=None)
    push([prepared])
    from kumiko_jobs.records import insert_queued

    insert_queued([prepared.row])
    assert drain(timeout=0.05) == {"requeued": 1}
    run = JobRun.objects.get(job_id=prepared.job_id)
    assert run.status == "queued" and "Unknown job" in run.logs[-1]["msg"]
    assert redis_client.zscore(get_keys().scheduled("worker"), prepared.job_id) is not None
    counts = drain(timeout=2)
    assert counts["failed"] == 1 and counts["requeued"] >= 1
    run.refresh_from_db()
    assert run.status == "failed" and "Unknown job 'tests.from_the_future'" in run.error


def test_unknown_per_tenant_job_gets_the_rolling_deploy_grace_too(
    settings: Any, tenants: list[Any], redis_client: Any
) -> None:
    future = dataclasses.replace(registry.get("tests.per_tenant"), name="tests.per_tenant_from_the_future")
    prepared = prepare(future, {}, tenant_id=None, user_id=None)
    push([prepared])
    from kumiko_jobs.records import insert_queued

    insert_queued([prepared.row])
    assert drain(timeout=0.05) == {"requeued": 1}
    run = JobRun.objects.get(job_id=prepared.job_id)
    assert run.status == "queued"
    assert "Unknown job 'tests.per_tenant_from_the_future'" in run.logs[-1]["msg"]
    assert redis_client.zscore(get_keys().scheduled("worker"), prepared.job_id) is not None


def test_malformed_job_fails_and_drain_keeps_going(redis_client: Any, traces: Any) -> None:
    keys = get_keys()
    bad_id = f"{keys.id_tag}-garbage"
    redis_client.hset(keys.job(bad_id), mapping={"data": b"not zlib json", "meta": "{}"})
    redis_client.rpush(keys.queue("worker"), bad_id)
    dispatch("tests.record", {"n": 1})
    assert drain() == {"failed": 1, "succeeded": 1}
    assert redis_client.zscore(keys.failed("worker"), bad_id) is not None
    assert len(traces("record")) == 1


def test_per_tenant_fans_out_once_per_active_tenant(tenants: list[Any], traces: Any) -> None:
    result = dispatch("tests.per_tenant", {"x": 1})
    wrapper = JobRun.objects.get(pk=result.run_id)
    assert wrapper.job_name == "_per_tenant:tests.per_tenant"
    drain()
    assert sorted(e["tenant"] for e in traces("per_tenant")) == sorted(str(t.pk) for t in tenants)
    assert all(e["payload"] == {"x": 1} for e in traces("per_tenant"))
    wrapper.refresh_from_db()
    assert (wrapper.status, wrapper.fanout_count) == ("succeeded", 3)


def test_fan_out_retry_never_enqueues_a_tenant_twice(
    tenants: list[Any], traces: Any, redis_client: Any
) -> None:
    from kumiko_jobs.fanout import run_fan_out
    from kumiko_jobs.jobdata import JobMeta

    result = dispatch("tests.per_tenant", {})
    meta_raw = redis_client.hget(get_keys().job(result.job_id), "meta")
    meta = JobMeta.from_json(meta_raw)
    # Run the wrapper twice (as a retry would) and also after Redis forgot the children.
    run_fan_out(meta, Started(result.job_id, {}, "w", datetime.now(UTC)), "tests.per_tenant")
    for tenant in tenants:
        redis_client.delete(get_keys().job(child_job_id(result.job_id, str(tenant.pk))))
    run_fan_out(meta, Started(result.job_id, {}, "w", datetime.now(UTC)), "tests.per_tenant")
    assert JobRun.objects.filter(job_name="tests.per_tenant").count() == 3


def test_escape_hatch_denied_without_grant() -> None:
    ctx = _context("tests.record")
    with pytest.raises(EscapeHatchDenied, match=r"tests\.record.*grants=\(\"unscoped\",\)"), ctx.unscoped():
        pass
    with pytest.raises(EscapeHatchDenied, match="system_identity"), ctx.as_user("u"):
        pass


def test_escape_hatch_use_is_audited_once_per_window(traces: Any, tenants: list[Any]) -> None:
    for _ in range(3):
        dispatch("tests.hatch", {}, tenant=tenants[0])
    dispatch("tests.hatch", {}, tenant=tenants[1])
    drain()
    assert len(traces("hatch")) == 4
    audits = {a.tenant_id: a for a in EscapeHatchAudit.objects.all()}
    assert set(audits) == {str(tenants[0].pk), str(tenants[1].pk)}
    first = audits[str(tenants[0].pk)]
    assert (first.count, first.kind, first.reason) == (3, "unscoped", "tests read across tenants")


def test_job_logger_levels_and_child_context() -> None:
    log = JobLogger("x", attempt=2)
    log.info("a %s", 1)
    log.debug("dropped")
    log.child(step="b").warning("w")
    log.error("e")
    assert [(line["level"], line["msg"], line["attempt"]) for line in log.lines] == [
        ("info", "a 1", 2),
        ("warning", "w {'step': 'b'}", 2),
        ("error", "e", 2),
    ]
    json.dumps(log.lines)


def test_job_logger_speaks_the_standard_loggers_methods() -> None:
    # Code written against logging.Logger: exception(), critical(), log(level, ...), exc_info=.
    log = JobLogger("x", attempt=1)
    try:
        raise ValueError("mail ann@example.com")
    except ValueError as exc:
        log.exception("export failed for %s", "acme")
        caught = exc
    log.critical("down")
    log.log(logging.WARNING, "w %d", 1)
    log.log(35, "between warning and error")
    log.log(logging.DEBUG, "dropped")
    log.info("with the exception given", exc_info=caught)
    log.warning("with a tuple", exc_info=(type(caught), caught, caught.__traceback__))
    log.exception("outside an except block")
    levels = [line["level"] for line in log.lines]
    assert levels == ["error", "critical", "warning", "warning", "info", "warning", "error"]
    first = log.lines[0]["msg"]
    assert first.startswith("export failed for acme\nTraceback (most recent call last):")
    # The traceback is scrubbed like the message.
    assert first.endswith("ValueError: mail [email]") and "ann@example.com" not in first
    assert log.lines[4]["msg"].endswith("ValueError: mail [email]")
    assert log.lines[5]["msg"].endswith("ValueError: mail [email]")
    assert log.lines[6]["msg"] == "outside an except block"
    with pytest.raises(TypeError, match=r"logging\.INFO"):
        log.log("info", "a name is not a level")  # type: ignore[arg-type]
    json.dumps(log.lines)


def test_a_log_call_the_standard_logger_takes_never_fails_the_job() -> None:
    """A mapping argument, extra=, stack_info=, stacklevel=, and arguments that do not fit the
    format: logging takes each of them; ctx.log raised, and the attempt failed."""
    log = JobLogger("x", attempt=1)
    log.info("user %(id)s signed in", {"id": 5})
    log.info("synced", extra={"shard": 3}, stacklevel=2)
    log.warning("100% done", "surplus")
    log.error("where am I", stack_info=True)
    messages = [line["msg"] for line in log.lines]
    assert messages[0] == "user 5 signed in"
    assert messages[1] == "synced {'shard': 3}"
    assert messages[2].startswith("100% done ('surplus',) (the arguments do not fit the format")
    assert messages[3].startswith("where am I\nStack (most recent call last):")
    with pytest.raises(TypeError, match="unexpected keyword"):
        log.info("x", colour="red")


def test_job_logger_keeps_a_bounded_record(caplog: pytest.LogCaptureFixture) -> None:
    log = JobLogger("x", attempt=2)
    child = log.child(step="b")  # counts against the same attempt
    for i in range(MAX_LOG_LINES - 1):
        log.info("line %d", i)
    child.info("last kept")
    for i in range(5):
        (log if i % 2 else child).warning("over %d", i)
    assert len(log.lines) == MAX_LOG_LINES + 1
    assert log.lines[MAX_LOG_LINES - 1]["msg"] == "last kept {'step': 'b'}"
    assert (log.lines[-1]["level"], log.lines[-1]["msg"], log.lines[-1]["attempt"]) == (
        "warning",
        f"5 more ctx.log line(s) not kept: a run record keeps {MAX_LOG_LINES} lines an attempt",
        2,
    )
    said = [r.getMessage() for r in caplog.records if "logged more than" in r.getMessage()]
    assert said == [f"kumiko_jobs: job x (attempt 2) logged more than {MAX_LOG_LINES} lines; its run "
                    f"record keeps the first {MAX_LOG_LINES} and counts the rest"]  # fmt: skip
    # One line is cut too, after scrubbing (a cut through a secret would hide it from the scrubber).
    long = JobLogger("x", attempt=1)
    long.info("%s ann@example.com", "a" * (MAX_LOG_LINE_CHARS - 5))
    assert long.lines[0]["msg"] == "a" * (MAX_LOG_LINE_CHARS - 5) + " [ema... [3 more characters not kept]"
    long.info("b" * (MAX_LOG_LINE_CHARS + 7))
    assert long.lines[1]["msg"] == "b" * MAX_LOG_LINE_CHARS + "... [7 more characters not kept]"


@pytest.mark.django_db(transaction=True)
def test_a_huge_error_message_is_kept_whole_once_and_cut_in_each_attempts_log_line() -> None:
    chars = MAX_LOG_LINE_CHARS + 500
    result = dispatch("tests.raise_long", {"chars": chars})
    assert drain() == {"retried": 1, "failed": 1}
    run = JobRun.objects.get(pk=result.run_id)
    assert run.error == "RuntimeError: " + "x" * chars
    assert run.traceback.rstrip().endswith("x" * chars)
    errors = [line["msg"] for line in run.logs if line["level"] == "error"]
    cut = "RuntimeError: " + "x" * (MAX_LOG_LINE_CHARS - 14) + "... [514 more characters not kept]"
    assert errors == [cut, cut]


@pytest.mark.django_db(transaction=True)
def test_text_a_record_cannot_hold_is_stored_replaced_and_the_run_is_not_run_again() -> None:
    """PostgreSQL refuses NUL in text and jsonb, and UTF-8 a lone surrogate: the outcome write
    failed, the record never said the run ended, and repair ran it again, and again."""
    ok = dispatch("tests.odd_text", {})
    failed = dispatch("tests.odd_text", {"fail": True})
    assert drain() == {"succeeded": 1, "failed": 1}
    ok_run, failed_run = JobRun.objects.get(pk=ok.run_id), JobRun.objects.get(pk=failed.run_id)
    assert ok_run.status == RunStatus.SUCCEEDED
    assert ok_run.logs[0]["msg"] == "read a\ufffdb?c"
    assert failed_run.status == RunStatus.FAILED
    assert failed_run.error == "ValueError: bad\ufffdbytes?"
    assert failed_run.traceback.rstrip().endswith("ValueError: bad\ufffdbytes?")
    assert drain() == {}


def _context(name: str) -> JobContext:
    definition = registry.get(name)
    return JobContext(
        job_name=name,
        run_id="r",
        job_id="j",
        tenant_id=None,
        attempt=1,
        final_attempt=True,
        triggered_by=None,
        trigger_name="",
        correlation_id="c",
        lane=definition.lane,
        definition=definition,
        log=JobLogger(name, 1),
    )


def test_a_handlers_context_variables_do_not_reach_the_next_job(tenants: list[Any]) -> None:
    """Run on one thread, one job after another: tenant B's job saw what tenant A's set
    (translation.activate, a logging library's bound fields)."""
    from tests.testapp.jobs import LEAKY

    dispatch("tests.sets_a_context_variable", {}, tenant=tenants[0])
    assert drain() == {"succeeded": 1}
    assert LEAKY.get() is None  # drain ran it on this thread, in this context


def test_a_sync_callable_that_returns_a_coroutine_is_awaited(traces: Any) -> None:
    """A sync decorator around an async def (or a class with an async __call__) is not a
    coroutine function: its coroutine was dropped, and the run recorded succeeded without its
    code having run."""
    dispatch("tests.async_callable", {})
    assert drain() == {"succeeded": 1}
    assert len(traces("async_callable")) == 1


def test_a_kept_connection_is_health_checked_before_the_next_job() -> None:
    """CONN_HEALTH_CHECKS had no effect between a worker's jobs: Django checks only a connection
    whose flag was cleared, and nothing cleared it."""
    from django.db import connection

    from kumiko_jobs.db_connections import tidy_after_job

    connection.ensure_connection()
    connection.health_check_done = True  # type: ignore[attr-defined]
    tidy_after_job()
    assert connection.health_check_done is False  # type: ignore[attr-defined]


def test_a_base_exception_of_a_handler_fails_its_attempt() -> None:
    """asyncio.CancelledError from async_to_sync, GeneratorExit, a library's own BaseException:
    escaping, it killed the job thread, and the run came back as abandoned."""
    import asyncio

    from kumiko_jobs.execution import RecordStartAtOnce, execute
    from kumiko_jobs.jobdata import JobMeta

    def cancelled(payload: dict[str, Any], ctx: Any) -> None:
        raise asyncio.CancelledError

    definition = dataclasses.replace(registry.get("tests.record"), func=cancelled)
    meta = JobMeta(run_id="01a24699-0000-7000-8000-000000000001", job_name="tests.record", lane="worker")
    start = Started(job_id="j-1", payload={}, worker="w", at=datetime.now(UTC))
    outcome = execute(
        definition, "j-1", meta, {}, consumer_lane="worker", start=start, observer=RecordStartAtOnce()
    )
    assert outcome.counted_as == "failed"
    assert "CancelledError" in JobRun.objects.get(pk=meta.run_id).error
