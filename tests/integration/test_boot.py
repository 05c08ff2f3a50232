"""End to end: boot jobs once per dataset and release; boot gates before any job is taken."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from kumiko_jobs import dispatch
from kumiko_jobs.models import JobRun, RunStatus
from tests.integration.support import holds_for, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
BOOT = {"KUMIKO_TEST_SCHEDULES": "boot_job"}
BOOT_GATE_FAILED = 3


def test_boot_job_runs_once_across_restarts_and_again_for_a_new_release(
    start_worker: Any, wait_for_traces: Any, traces: Any
) -> None:
    first = start_worker("worker", env=BOOT)
    [run] = wait_for_traces("boot_job")
    assert (run["trigger"], run["user"], run["scheduled_at"]) == ("boot", None, None)
    first.stop()

    second = start_worker("worker", env=BOOT)
    third = start_worker("worker", env=BOOT)  # two processes starting: still nothing new
    assert holds_for(lambda: len(traces("boot_job")) == 1, seconds=2)
    second.stop()
    third.stop()

    start_worker("worker", env={**BOOT, "KUMIKO_TEST_RELEASE": "2025.06.1"})
    wait_for_traces("boot_job", count=2)
    assert JobRun.objects.filter(job_name="tests.boot_job", trigger_name="boot").count() == 2


def test_a_failing_gate_stops_the_worker_before_it_takes_a_job(start_worker: Any, traces: Any) -> None:
    waiting = dispatch("tests.record", {"n": 1})
    worker = start_worker("worker", env={"KUMIKO_TEST_SCHEDULES": "gate_ok,gate_fail"}, wait=False)

    assert worker.wait(30) == BOOT_GATE_FAILED
    lines = worker.output().splitlines()
    assert "boot gate tests.gate_fail failed: RuntimeError: schema is behind: run migrations" in lines
    assert [t["job"] for t in traces() if t["kind"].startswith("gate")] == [
        "tests.gate_ok",
        "tests.gate_fail",
    ]
    gates = {r.job_name: r for r in JobRun.objects.filter(trigger_name="boot_gate")}
    assert (gates["tests.gate_ok"].status, gates["tests.gate_fail"].status) == (
        RunStatus.SUCCEEDED,
        RunStatus.FAILED,
    )
    assert JobRun.objects.get(pk=waiting.run_id).status == RunStatus.QUEUED
    assert traces("record") == []


def test_a_gate_past_its_timeout_stops_the_worker(start_worker: Any) -> None:
    worker = start_worker("worker", env={"KUMIKO_TEST_SCHEDULES": "gate_timeout"}, wait=False)

    assert worker.wait(30) == BOOT_GATE_FAILED
    assert (
        "boot gate tests.gate_timeout failed: JobTimeout: Job 'tests.gate_timeout' exceeded its timeout "
        "of 0.5s and was stopped." in worker.output().splitlines()
    )


def test_a_slow_gate_warns_then_the_worker_starts(start_worker: Any, wait_for_run: Any) -> None:
    env = {
        "KUMIKO_TEST_SCHEDULES": "gate_slow",
        "KUMIKO_TEST_BOOT_GATE_WARN_AFTER": "0.5",
        "KUMIKO_TEST_GATE_SECONDS": "1.5",
    }
    worker = start_worker("worker", env=env)

    assert wait_for_run(dispatch("tests.record", {}).run_id).status == RunStatus.SUCCEEDED
    assert "boot gate tests.gate_slow is still running after 0.5s" in worker.output()
    wait_until(
        lambda: JobRun.objects.filter(job_name="tests.gate_slow", status="succeeded").exists(), 5, "gate row"
    )


def test_defer_in_a_gate_fails_the_start_up(start_worker: Any) -> None:
    worker = start_worker("worker", env={"KUMIKO_TEST_SCHEDULES": "gate_defer"}, wait=False)

    assert worker.wait(30) == BOOT_GATE_FAILED
    assert "boot gate tests.gate_defer failed: DeferralError:" in worker.output()


def test_a_supervisor_passes_the_gates_once_before_its_children_start(
    start_worker: Any, redis_client: Any, kumiko_prefix: str, traces: Any
) -> None:
    from kumiko_jobs.connection import get_keys

    env = {"KUMIKO_TEST_SCHEDULES": "gate_ok,boot_job"}
    start_worker("worker", "--processes", "2", env=env, wait=False)
    names = [f"{kumiko_prefix}-worker-1-p{slot}" for slot in (1, 2)]
    wait_until(
        lambda: all(redis_client.sismember(get_keys().claimers("worker"), n) for n in names), 30, "children"
    )
    wait_until(lambda: traces("boot_job"), 10, "the boot job")

    assert len(traces("gate_ok")) == 1  # in the supervisor, not again in each child
    assert JobRun.objects.filter(job_name="tests.gate_ok", trigger_name="boot_gate").count() == 1
    assert len(traces("boot_job")) == 1


def test_a_supervisor_whose_gate_fails_starts_no_child(start_worker: Any, traces: Any) -> None:
    supervisor = start_worker(
        "worker", "--processes", "2", env={"KUMIKO_TEST_SCHEDULES": "gate_fail"}, wait=False
    )

    assert supervisor.wait(30) == BOOT_GATE_FAILED
    assert "boot gate tests.gate_fail failed: RuntimeError: schema is behind: run migrations" in (
        supervisor.output().splitlines()
    )
    assert len(traces("gate_fail")) == 1


def test_the_children_a_sighup_starts_pass_the_gates_themselves(
    start_worker: Any, redis_client: Any, kumiko_prefix: str, traces: Any
) -> None:
    """A deploy's reload: the new children import newer code than the supervisor passed the
    gates with (a gate may now find the schema behind), so each passes them itself. Before, the
    supervisor's own environment told every child it ever started that the gates had passed."""
    from kumiko_jobs.connection import get_keys

    supervisor = start_worker(
        "worker", "--processes", "2", env={"KUMIKO_TEST_SCHEDULES": "gate_ok"}, wait=False
    )
    names = [f"{kumiko_prefix}-worker-1-p{slot}" for slot in (1, 2)]
    wait_until(
        lambda: all(redis_client.sismember(get_keys().claimers("worker"), n) for n in names), 30, "children"
    )
    assert len(traces("gate_ok")) == 1
    supervisor.signal(signal.SIGHUP)

    wait_until(lambda: len(traces("gate_ok")) >= 3, 30, "a gate in each new child")
    gates = traces("gate_ok")
    assert gates[0]["pid"] == supervisor.pid
    assert len({g["pid"] for g in gates[1:]} - {supervisor.pid}) == 2
    succeeded = JobRun.objects.filter(job_name="tests.gate_ok", status=RunStatus.SUCCEEDED)
    wait_until(lambda: succeeded.count() == 3, 10, "the gates' rows")


def test_a_gate_that_refuses_the_reloaded_code_stops_the_supervisor_with_its_status(
    start_worker: Any, redis_client: Any, kumiko_prefix: str, traces: Any
) -> None:
    """After a SIGHUP the new children's gate fails: the supervisor exits 3, as runjobs does
    when a gate refuses a release, instead of restarting them until it calls it a crash loop."""
    from kumiko_jobs.connection import get_keys

    supervisor = start_worker(
        "worker", "--processes", "2", env={"KUMIKO_TEST_SCHEDULES": "gate_flips"}, wait=False
    )
    names = [f"{kumiko_prefix}-worker-1-p{slot}" for slot in (1, 2)]
    wait_until(
        lambda: all(redis_client.sismember(get_keys().claimers("worker"), n) for n in names), 30, "children"
    )
    redis_client.set(f"{get_keys().prefix}:gate_flips", "1")  # the release on disk is now refused
    supervisor.signal(signal.SIGHUP)

    assert supervisor.wait(30) == BOOT_GATE_FAILED, supervisor.output()
    assert "a boot gate refused the reloaded code" in supervisor.output()
    assert len(traces("gate_flips")) in (2, 3)  # the supervisor's, then one or both new children's


def test_a_gates_mark_does_not_skip_the_gates_of_a_runjobs_no_supervisor_started(start_worker: Any) -> None:
    """The mark as a worker process kept it before, where a ``runjobs`` one of its jobs started
    inherited it: that process took jobs without its database check and its gates."""
    from kumiko_jobs.supervisor import GATES_PASSED_ENV

    worker = start_worker(
        "worker",
        "--burst",
        # Well formed, naming a process that is not this worker's parent (as a job's child sees it).
        env={GATES_PASSED_ENV: "worker:1", "KUMIKO_TEST_SCHEDULES": "gate_fail"},
        wait=False,
    )

    assert worker.wait(30) == BOOT_GATE_FAILED
