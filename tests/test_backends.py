"""KumikoTaskBackend beyond Django's own cases: tenants, lanes, retries, results, signals."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started

from kumiko_jobs import dispatch
from kumiko_jobs.backends import KumikoTaskBackend
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.registry import registry
from kumiko_jobs.retrying import retry_failed
from kumiko_jobs.tenancy import tenant_context
from kumiko_jobs.testing import drain
from tests.integration.support import REPO_ROOT
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_task_is_a_job_with_its_options() -> None:
    definition = registry.get("tests.testapp.tasks.flaky")
    assert definition.task is tasks.flaky
    assert (definition.lane, definition.retries, definition.max_attempts) == ("worker", 2, 3)
    assert registry.get("tests.testapp.tasks.on_api").lane == "api"
    capped = registry.get("tests.testapp.tasks.capped").max_per_tenant
    assert capped is not None and (capped.limit, capped.on_limit) == (1, "defer")


def test_the_tenant_is_the_current_one(tenants: list[Any], traces: Any) -> None:
    with tenant_context(tenants[0]):  # a model instance is its key, not its display name
        inside = tasks.traced.enqueue("inside")
    outside = tasks.traced.enqueue("outside")
    assert JobRun.objects.get(pk=inside.id).tenant_id == str(tenants[0].pk)
    assert JobRun.objects.get(pk=outside.id).tenant_id is None
    drain()
    inside.refresh()
    assert inside.return_value == {"label": "inside", "tenant": str(tenants[0].pk)}


def test_a_task_enqueued_inside_a_run_takes_its_tenant(tenants: list[Any]) -> None:
    with tenant_context(str(tenants[1].pk)):
        parent = tasks.enqueue_child.enqueue("child")
    assert drain() == {"succeeded": 2}
    parent.refresh()
    child = JobRun.objects.get(pk=parent.return_value)
    assert (child.tenant_id, child.job_name) == (str(tenants[1].pk), "tests.testapp.tasks.traced")
    assert child.correlation_id == JobRun.objects.get(pk=parent.id).correlation_id


def test_an_unknown_tenant_is_refused_before_anything_is_written() -> None:
    from kumiko_jobs import InvalidTenant

    with tenant_context("999999"), pytest.raises(InvalidTenant, match="does not exist"):
        tasks.traced.enqueue("x")
    assert not JobRun.objects.exists()


def test_queue_names_pick_the_lane() -> None:
    default = tasks.traced.enqueue("default")
    api = tasks.traced.using(queue_name="api").enqueue("api")
    worker = tasks.on_api.using(queue_name="worker").enqueue("worker")
    assert [JobRun.objects.get(pk=r.id).lane for r in (default, api, worker)] == ["worker", "api", "worker"]
    assert drain(lanes=("api",)) == {"succeeded": 1}
    api.refresh()
    assert api.task.queue_name == "api" and api.return_value == {"label": "api", "tenant": None}


def test_retries_are_visible_in_the_result(traces: Any) -> None:
    result = tasks.flaky.enqueue(3)
    assert drain() == {"retried": 2, "succeeded": 1}
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (TaskResultStatus.SUCCESSFUL, 3, 3)
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]
    assert result.errors[0].traceback == "RuntimeError: flaky task failure on attempt 1\n"
    # Each attempt saw the attempts before it, itself included (Django's context.attempt).
    assert [(e["attempt"], len(e["workers"])) for e in traces("task_flaky")] == [(1, 1), (2, 2), (3, 3)]


def test_a_final_failure_keeps_every_attempts_error() -> None:
    result = tasks.flaky.enqueue(99)
    assert drain() == {"retried": 2, "failed": 1}
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 3
    assert [e.traceback.splitlines()[-1] for e in result.errors] == [
        f"RuntimeError: flaky task failure on attempt {n}" for n in (1, 2, 3)
    ]
    assert result.errors[-1].traceback.startswith("Traceback (most recent call last):")


def test_return_values_are_json() -> None:
    ok = tasks.returns_tuple.enqueue()
    bad = tasks.returns_nan.enqueue()
    drain()
    ok.refresh()
    bad.refresh()
    assert ok.return_value == [1, "two"]
    assert JobRun.objects.get(pk=ok.id).result == [1, "two"]
    assert bad.status == TaskResultStatus.FAILED
    assert bad.errors[0].exception_class is TypeError
    assert "returned a value that is not JSON (nan is not representable in JSON)" in bad.errors[0].traceback


def test_a_return_value_that_cannot_be_stored_fails_the_task_without_retries() -> None:
    """The task ran and did its work: another attempt would only do it again."""
    result = tasks.returns_a_set_once.enqueue()
    assert drain() == {"failed": 1}
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 1)
    assert result.errors[0].exception_class is TypeError  # as Django's own backends report it
    assert get_redis().get(f"{get_keys().prefix}:returns_a_set_once") == b"1"


def test_a_return_value_is_stored_as_json_stores_it() -> None:
    """Keys become strings, as a JSONField writes them (Django's own backends accept {1: ...};
    the run failed with "keys must be str" after the task had done its work)."""
    keyed = tasks.returns_int_keys.enqueue()
    assert drain() == {"succeeded": 1}
    keyed.refresh()
    assert (keyed.status, keyed.return_value) == (TaskResultStatus.SUCCESSFUL, {"1": "one"})


def test_a_whole_float_priority_orders_as_its_int(traces: Any) -> None:
    # Django's validation takes 5.0; the run must wait with priority 5 (it waited with 0).
    tasks.traced.enqueue("plain")
    tasks.traced.using(priority=5.0).enqueue("five")
    assert drain() == {"succeeded": 2}
    assert [e["label"] for e in traces("traced_start")] == ["five", "plain"]


def test_an_aware_run_after_with_use_tz_off(settings: Any) -> None:
    """Django takes an aware run_after when USE_TZ is off too; comparing it with the naive local
    now raised TypeError from enqueue."""
    from datetime import UTC, datetime, timedelta

    settings.USE_TZ = False
    result = tasks.noop_task.using(run_after=datetime.now(UTC) + timedelta(seconds=60)).enqueue()
    assert drain(timeout=0.2) == {}  # not due yet
    run = JobRun.objects.get(pk=result.id)
    assert run.status == RunStatus.QUEUED and run.next_attempt_at is not None


def test_a_raising_task_enqueued_receiver_inside_atomic_cancels_no_other_commit_work() -> None:
    from django.db import transaction

    def refuse(**kwargs: Any) -> None:
        raise RuntimeError("a receiver's bug")

    after: list[str] = []
    task_enqueued.connect(refuse)
    try:
        with transaction.atomic():
            first = tasks.noop_task.enqueue(1)
            second = tasks.noop_task.enqueue(2)
            transaction.on_commit(lambda: after.append("ran"))
    finally:
        task_enqueued.disconnect(refuse)
    # Before, the receiver's error came out of atomic() after COMMIT, and the callbacks after
    # it (the second enqueue's push, the caller's own) never ran.
    assert after == ["ran"]
    assert {JobRun.objects.get(pk=r.id).pushed_at is not None for r in (first, second)} == {True}
    assert drain() == {"succeeded": 2}


def test_arguments_a_run_record_cannot_store_are_refused() -> None:
    from kumiko_jobs import InvalidPayload

    with pytest.raises(InvalidPayload, match="keys must be str"):
        tasks.noop_task.enqueue({1: 2})
    assert not JobRun.objects.exists()


def test_a_job_run_is_not_a_task_result() -> None:
    run = dispatch("tests.record", {"n": 1})
    message = r"is a run of job 'tests\.record', not of a Django task"
    with pytest.raises(TaskResultDoesNotExist, match=message):
        default_task_backend.get_result(str(run.run_id))


def test_signals_are_sent_as_django_sends_them() -> None:
    received: list[tuple[str, Any, set[str], Any]] = []

    def receiver(signal: Any, sender: Any, **kwargs: Any) -> None:
        received.append((signal_names[signal], sender, set(kwargs), kwargs["task_result"].status))

    signal_names = {task_enqueued: "enqueued", task_started: "started", task_finished: "finished"}
    for signal in signal_names:
        signal.connect(receiver)
    try:
        tasks.calculate_meaning_of_life.enqueue()
        tasks.failing_task_value_error.enqueue()
        drain()
    finally:
        for signal in signal_names:
            signal.disconnect(receiver)
    assert received == [
        ("enqueued", KumikoTaskBackend, {"task_result"}, TaskResultStatus.READY),
        ("enqueued", KumikoTaskBackend, {"task_result"}, TaskResultStatus.READY),
        ("started", KumikoTaskBackend, {"task_result"}, TaskResultStatus.RUNNING),
        ("finished", KumikoTaskBackend, {"task_result"}, TaskResultStatus.SUCCESSFUL),
        ("started", KumikoTaskBackend, {"task_result"}, TaskResultStatus.RUNNING),
        ("finished", KumikoTaskBackend, {"task_result"}, TaskResultStatus.FAILED),
    ]


def test_a_failing_receiver_never_fails_the_run(caplog: pytest.LogCaptureFixture) -> None:
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    task_started.connect(broken)
    task_finished.connect(broken)
    try:
        result = tasks.calculate_meaning_of_life.enqueue()
        assert drain() == {"succeeded": 1}
    finally:
        task_started.disconnect(broken)
        task_finished.disconnect(broken)
    result.refresh()
    assert result.return_value == 42
    assert sum("a receiver of a Django task signal failed" in r.getMessage() for r in caplog.records) == 2


def test_retry_by_hand_keeps_lane_and_priority(redis_client: Any) -> None:
    from kumiko_jobs.connection import get_keys

    failed = tasks.failing_task_value_error.using(queue_name="api", priority=7).enqueue()
    drain()
    retry = retry_failed(JobRun.objects.get(pk=failed.id))
    run = JobRun.objects.get(pk=retry.run_id)
    assert (run.lane, run.retry_of, run.status) == (
        "api",
        JobRun.objects.get(pk=failed.id).pk,
        RunStatus.QUEUED,
    )
    assert redis_client.hget(get_keys().job(retry.job_id), "kumiko_pri") == b"7"
    again = default_task_backend.get_result(str(retry.run_id))
    assert (again.task.priority, again.task.queue_name, again.status) == (7, "api", TaskResultStatus.READY)


def test_validation_refuses_what_cannot_be_run() -> None:
    from datetime import timedelta

    with pytest.raises(InvalidTask, match="run_after must be a datetime, got timedelta"):
        tasks.noop_task.using(run_after=timedelta(seconds=5))  # type: ignore[arg-type]
    with pytest.raises(InvalidTask, match="Queue 'low' is not valid for backend"):
        tasks.noop_task.using(queue_name="low")


def test_a_worker_finds_a_task_by_its_name_alone() -> None:
    # A fresh interpreter that never imported the module: the registry's resolver imports it.
    code = (
        "import django; django.setup();"
        "from kumiko_jobs.registry import registry;"
        "assert 'tests.testapp.lazy_tasks.lazy' not in registry;"
        "d = registry.find('tests.testapp.lazy_tasks.lazy');"
        "print(d.name, d.lane, d.task.module_path);"
        "print(registry.find('tests.testapp.lazy_tasks.not_a_task'), registry.find('nowhere.at.all'))"
    )
    output = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings", "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split("\n")
    assert output[:2] == [
        "tests.testapp.lazy_tasks.lazy api tests.testapp.lazy_tasks.lazy",
        "None None",
    ]


def test_options_at_djangos_defaults_stay_out_of_the_payload() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from kumiko_jobs.task_payloads import decode_call

    later = (timezone.now() + timedelta(hours=1)).replace(microsecond=0)
    plain = tasks.noop_task.enqueue()
    chosen = tasks.noop_task.using(priority=3, queue_name="api", run_after=later).enqueue()
    assert set(JobRun.objects.get(pk=plain.id).payload["task"]) == {"enqueued_at"}
    assert set(JobRun.objects.get(pk=chosen.id).payload["task"]) == {
        "enqueued_at",
        "priority",
        "queue_name",
        "run_after",
    }
    for result in (plain, chosen):
        again = default_task_backend.get_result(result.id)
        assert (again.task.priority, again.task.queue_name, again.task.run_after) == (
            result.task.priority,
            result.task.queue_name,
            result.task.run_after,
        )
    # A left-out option is Django's default, not the declared task's: .using(priority=0) of a
    # task declared with priority 5 stays 0.
    base = tasks.noop_task.using(priority=5)
    stamp = timezone.now().isoformat()
    trimmed = decode_call(base, {"args": [], "kwargs": {}, "task": {"enqueued_at": stamp}})
    assert (trimmed.task.priority, trimmed.task.queue_name, trimmed.task.backend) == (0, "default", "default")
    # Runs queued by an earlier version carry every option.
    full = {"priority": 2, "queue_name": "api", "backend": "default", "run_after": None, "enqueued_at": stamp}
    earlier = decode_call(base, {"args": [1], "kwargs": {}, "task": full})
    assert (earlier.task.priority, earlier.task.queue_name, earlier.args) == (2, "api", [1])
    with pytest.raises(ValueError, match=r"is not what KumikoTaskBackend\.enqueue"):
        decode_call(base, {"args": [], "kwargs": {}, "task": ["not", "a", "dict"]})


def test_enqueue_validates_a_task_once_unless_the_backends_flags_change() -> None:
    from datetime import timedelta
    from unittest import mock

    from django.utils import timezone

    task = tasks.noop_task.using(run_after=timezone.now() + timedelta(hours=1))
    backend = task.get_backend()
    with mock.patch.object(backend, "validate_task", wraps=backend.validate_task) as validate:
        task.enqueue()
        task.enqueue()
    assert validate.call_count == 1  # a new Task (its own run_after): checked on its first enqueue only
    with (
        mock.patch.multiple(backend, supports_defer=False),
        pytest.raises(InvalidTask, match="Backend does not support run_after"),
    ):
        task.enqueue()


def test_a_task_whose_runs_a_skip_limit_would_drop_is_refused() -> None:
    """.enqueue() must return a result: it returned READY for a run the limit dropped (system
    check E501 said so, and could be silenced). Django validates a task where it is declared."""
    from django.tasks import task

    from kumiko_jobs import MaxPerTenant

    with pytest.raises(InvalidTask, match='on_limit="skip"') as refused:
        task(max_per_tenant=MaxPerTenant(2, on_limit="skip"))(skip_limited)
    assert 'MaxPerTenant(2, on_limit="defer")' in str(refused.value)  # the hint
    assert "tests.test_backends.skip_limited" not in registry


def skip_limited() -> None:
    """A task function that only the test above declares (with a skip limit)."""


def test_a_task_enqueued_in_a_run_takes_its_tenant_whatever_the_activator(
    settings: Any, tenants: list[Any]
) -> None:
    """A project's activator need not set kumiko's current-tenant variable: a task enqueued in
    the run became a system run, and an async handler's database thread was activated for none."""
    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "TENANT_ACTIVATOR": "tests.testapp.activators.schema_only",
    }
    with tenant_context(str(tenants[1].pk)):
        parent = tasks.enqueue_child.enqueue("child")
    assert drain() == {"succeeded": 2}
    parent.refresh()
    assert JobRun.objects.get(pk=parent.return_value).tenant_id == str(tenants[1].pk)


def test_a_run_after_more_than_a_year_ahead_is_an_invalid_task() -> None:
    """Django's contract: a task the backend cannot run is InvalidTask (Django checks it as the
    task is made), not kumiko's InvalidDispatch from enqueue()."""
    from datetime import timedelta

    from django.utils import timezone

    with pytest.raises(InvalidTask, match="more than 366 days ahead"):  # Django validates in using()
        tasks.returns_tuple.using(run_after=timezone.now() + timedelta(days=400)).enqueue()
    assert not JobRun.objects.exists()
    near = tasks.returns_tuple.using(run_after=timezone.now() + timedelta(days=300))
    assert near.enqueue().status.name == "READY"
