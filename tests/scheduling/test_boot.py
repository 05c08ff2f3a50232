"""Boot jobs (once per dataset and release) and boot gates (inline, recorded, strict)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from kumiko_jobs.context import JobContext
from kumiko_jobs.exceptions import BootGateFailed
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.registry import build_definition, registry
from kumiko_jobs.scheduling.boot_gates import run_boot_gates
from kumiko_jobs.scheduling.boot_jobs import dispatch_boot_jobs
from tests.testapp.jobs import trace

pytestmark = pytest.mark.django_db(transaction=True)


def noted(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("gate", job=ctx.job_name, attempt=ctx.attempt, trigger=ctx.trigger_name)


def failing(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("gate", job=ctx.job_name, attempt=ctx.attempt, trigger=ctx.trigger_name)
    raise RuntimeError(f"attempt {ctx.attempt} failed")


def deferring(payload: dict[str, Any], ctx: JobContext) -> Any:
    return ctx.defer(50)


async def async_failing(payload: dict[str, Any], ctx: JobContext) -> None:
    trace("async_gate", job=ctx.job_name)
    raise RuntimeError("the schema is behind")


def interrupted(payload: dict[str, Any], ctx: JobContext) -> None:
    raise KeyboardInterrupt


@pytest.fixture
def jobs() -> Any:
    with registry.isolated():

        def add(name: str, func: Any = noted, **options: Any) -> None:
            registry.register(build_definition(func, name, options))

        yield add


def test_boot_job_is_dispatched_once_per_release(jobs: Any, settings: Any) -> None:
    jobs("t.warm", run_on_boot=True)
    jobs("t.api_warm", run_on_boot=True, lane="api")

    [first] = dispatch_boot_jobs("worker")
    assert dispatch_boot_jobs("worker") == []  # a restart: already dispatched
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "RELEASE": "2025.06.1"}
    [again] = dispatch_boot_jobs("worker")
    assert dispatch_boot_jobs("worker") == []

    runs = JobRun.objects.filter(job_name="t.warm").order_by("queued_at")
    assert [(r.job_id, r.trigger_name) for r in runs] == [(first.job_id, "boot"), (again.job_id, "boot")]
    assert not JobRun.objects.filter(job_name="t.api_warm").exists()  # its lane's worker dispatches it


def test_gates_run_inline_in_declaration_order_with_records(jobs: Any, traces: Any) -> None:
    jobs("t.not_a_gate")
    jobs("t.gate_b", boot_gate=True)
    jobs("t.gate_a", boot_gate=True)
    jobs("t.api_gate", boot_gate=True, lane="api")

    assert run_boot_gates("worker", worker="w1") == 2

    assert [t["job"] for t in traces("gate")] == ["t.gate_b", "t.gate_a"]
    runs = JobRun.objects.filter(trigger_name="boot_gate")
    assert sorted((r.job_name, r.status, r.worker) for r in runs) == [
        ("t.gate_a", RunStatus.SUCCEEDED, "w1"),
        ("t.gate_b", RunStatus.SUCCEEDED, "w1"),
    ]


def test_a_failing_gate_stops_start_up_after_its_retries(jobs: Any, traces: Any) -> None:
    jobs("t.gate", failing, boot_gate=True, retries=1)
    jobs("t.after", boot_gate=True)

    with pytest.raises(BootGateFailed) as raised:
        run_boot_gates("worker", worker="w1")

    assert str(raised.value) == "boot gate t.gate failed: RuntimeError: attempt 2 failed"
    assert [t["attempt"] for t in traces("gate")] == [1, 2]  # t.after never ran
    [run] = JobRun.objects.filter(job_name="t.gate")
    assert (run.status, run.attempt, run.trigger_name) == (RunStatus.FAILED, 2, "boot_gate")


def test_defer_inside_a_gate_raises_deferral_error(jobs: Any) -> None:
    jobs("t.gate", deferring, boot_gate=True)

    with pytest.raises(
        BootGateFailed, match=r"boot gate t.gate failed: DeferralError: .*not available inline"
    ):
        run_boot_gates("worker", worker="w1")


def test_a_gate_past_its_timeout_fails(jobs: Any) -> None:
    jobs("t.gate", sleeping, boot_gate=True, timeout=0.2)

    with pytest.raises(BootGateFailed, match=r"JobTimeout: Job 't.gate' exceeded its timeout of 0.2s"):
        run_boot_gates("worker", worker="w1")


def test_a_slow_gate_without_timeout_warns(
    jobs: Any, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "BOOT_GATE_WARN_AFTER": 0.1}
    jobs("t.gate", sleeping, boot_gate=True)

    with caplog.at_level(logging.WARNING, logger="kumiko_jobs"):
        run_boot_gates("worker", worker="w1")

    assert "boot gate t.gate is still running after 0.1s" in caplog.text


def sleeping(payload: dict[str, Any], ctx: JobContext) -> None:
    import time

    time.sleep(0.4)


def test_an_async_gate_runs_and_its_failure_stops_the_worker(jobs: Any, traces: Any) -> None:
    """The gate's wrapper was a plain function: the worker called it on the sync path, which
    only created the coroutine, and the gate passed without running."""
    jobs("t.async_gate", async_failing, boot_gate=True)
    with pytest.raises(BootGateFailed, match="the schema is behind"):
        run_boot_gates("worker", worker="w1")
    assert len(traces("async_gate")) == 1


def test_a_gate_run_is_never_pushed_by_repair_or_the_outbox(jobs: Any) -> None:
    """It runs inline and Redis never holds it: repair took a slow gate's row for a lost run and
    pushed it, so the gate ran a second time as a queued job."""
    from kumiko_jobs.connection import get_keys
    from kumiko_jobs.rebuild import owned_by

    jobs("t.gate_a", boot_gate=True)
    run_boot_gates("worker", worker="w1")
    gate = JobRun.objects.get(job_name="t.gate_a")
    assert gate.job_id.startswith(f"{get_keys().id_tag}-gate-")
    assert not JobRun.objects.filter(owned_by(get_keys()), pk=gate.pk).exists()


def test_a_gate_stopped_midway_is_recorded_failed(jobs: Any) -> None:
    jobs("t.gate_stopped", interrupted, boot_gate=True)
    with pytest.raises(KeyboardInterrupt):
        run_boot_gates("worker", worker="w1")
    run = JobRun.objects.get(job_name="t.gate_stopped")
    assert (run.status, run.error) == (RunStatus.FAILED, "The worker stopped during its boot gate.")
