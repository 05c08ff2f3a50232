"""Django ``@task`` functions of the test suite, declared under the test settings' TASKS
(KumikoTaskBackend). The first group does what the helper tasks of Django's own ``tests/tasks``
do (their names, signatures and messages, which Django's test cases check); the second records
traces (tests/testapp/jobs.py) for kumiko's own tests and the runjobs integration tests."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from django.tasks import TaskContext, task

from kumiko_jobs import Backoff
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.tenancy import current_tenant_id
from tests.testapp.jobs import SECRET_TEXT, trace

# --- what Django's test cases expect ---------------------------------------------------------


@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task
def noop_task_from_bare_decorator(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def failing_task_value_error() -> None:
    raise ValueError("This Task failed due to ValueError")


@task()
def failing_task_system_exit() -> None:
    raise SystemExit("This Task failed due to SystemExit")


@task()
def failing_task_keyboard_interrupt() -> None:
    raise KeyboardInterrupt("This Task failed due to KeyboardInterrupt")


@task()
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value() -> Any:
    # Neither JSON nor picklable.
    return lambda: True


@task()
def exit_task() -> None:
    sys.exit(1)


@task()
def hang() -> None:
    time.sleep(300)


@task()
def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


@task(takes_context=True)
def get_task_id(context: TaskContext) -> str:
    return context.task_result.id


@task(takes_context=True)
def test_context(context: TaskContext, attempt: int) -> None:
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt


# --- kumiko's own tests ----------------------------------------------------------------------


@task()
def traced(label: str, seconds: float = 0.0) -> dict[str, Any]:
    """Records its start and end with the tenant it ran for; returns what it saw."""
    trace("traced_start", label=label, tenant=current_tenant_id())
    time.sleep(seconds)
    trace("traced_end", label=label, tenant=current_tenant_id())
    return {"label": label, "tenant": current_tenant_id()}


@task(queue_name="api")
def on_api(label: str) -> str:
    trace("on_api", label=label, tenant=current_tenant_id())
    return label


@task(takes_context=True, retries=2, backoff=Backoff("fixed", delay_ms=50))
def flaky(context: TaskContext, succeed_on: int) -> int:
    """Fails until attempt ``succeed_on`` (50 ms between attempts)."""
    trace("task_flaky", attempt=context.attempt, workers=context.task_result.worker_ids)
    if context.attempt < succeed_on:
        raise RuntimeError(f"flaky task failure on attempt {context.attempt}")
    return context.attempt


@task(max_per_tenant=1)
def capped(label: str, seconds: float) -> None:
    """At most one run per tenant at a time; the rest wait."""
    trace("capped_start", label=label, tenant=current_tenant_id())
    time.sleep(seconds)
    trace("capped_end", label=label, tenant=current_tenant_id())


@task(timeout=0.3)
async def slow_async(seconds: float) -> str:
    trace("slow_async_start", tenant=current_tenant_id())
    await asyncio.sleep(seconds)
    trace("slow_async_end", tenant=current_tenant_id())
    return "done"


@task()
def enqueue_child(label: str) -> str:
    """Enqueues ``traced`` from inside a run: the child inherits this run's tenant."""
    child = traced.enqueue(label)
    return child.id


@task()
def returns_tuple() -> tuple[int, str]:
    return (1, "two")


@task()
def returns_nan() -> float:
    return float("nan")


@task(retries=2, backoff=Backoff("fixed", delay_ms=10))
def returns_a_set_once() -> set[int]:
    """Returns a value no run record can store; counts its calls (a retry would call it again)."""
    get_redis().incr(f"{get_keys().prefix}:returns_a_set_once")
    return {1}


@task()
def returns_int_keys() -> dict[int, str]:
    return {1: "one"}


@task()
def count_runs(key: str) -> int:
    return int(get_redis().incr(f"{get_keys().prefix}:{key}"))


@task()
def raise_secret() -> None:
    """Fails with text full of personal data and secrets (django.tasks logs it: scrubbed)."""
    raise ValueError(SECRET_TEXT)
