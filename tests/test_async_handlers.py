"""``async def`` handlers through drain(): the worker's execution path, in-process."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from kumiko_jobs import dispatch
from kumiko_jobs.async_handlers import close_thread_loop, run_coroutine
from kumiko_jobs.exceptions import JobTimeout
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.tenancy import current_tenant_id, tenant_context
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def test_async_handler_runs_with_its_tenant_log_and_context(traces: Any, tenants: list[Any]) -> None:
    result = dispatch("tests.async_record", {"n": 1}, tenant=tenants[0])
    assert drain() == {"succeeded": 1}
    [entry] = traces("async_record")
    assert entry["active_tenant"] == entry["tenant"] == str(tenants[0].pk)
    assert entry["run_id"] == result.run_id
    run = JobRun.objects.get(pk=result.run_id)
    assert run.status == RunStatus.SUCCEEDED
    assert [line["msg"] for line in run.logs] == [f"async handler ran for {tenants[0].pk}"]


def test_ctx_dispatch_works_inside_an_async_handler(traces: Any, tenants: list[Any]) -> None:
    dispatch("tests.async_record", {"chain": True, "achain": True}, tenant=tenants[1])
    assert drain() == {"succeeded": 3}
    [entry] = traces("async_record")
    children = JobRun.objects.filter(pk__in=[entry["chained"], entry["achained"]])
    assert {(c.job_name, c.tenant_id, c.correlation_id) for c in children} == {
        ("tests.record", str(tenants[1].pk), entry["corr"])
    }
    assert {e["payload"]["n"] for e in traces("record")} == {"from-async", "from-async-a"}


def test_async_timeout_cancels_the_coroutine_and_retries(traces: Any) -> None:
    result = dispatch("tests.async_slow", {"seconds": 5})
    started = time.monotonic()
    assert drain() == {"retried": 1, "failed": 1}
    assert time.monotonic() - started < 2  # two attempts of 0.2 s, not of 5 s
    assert len(traces("async_slow_start")) == 2 and traces("async_slow_end") == []
    run = JobRun.objects.get(pk=result.run_id)
    assert run.error == "JobTimeout: Job 'tests.async_slow' exceeded its timeout of 0.2s and was cancelled."


def test_tasks_left_running_are_cancelled_when_the_handler_returns(traces: Any) -> None:
    dispatch("tests.async_record", {"leak": True})
    dispatch("tests.async_slow", {"seconds": 0.1})  # the next job on the same loop, 0.1 s long
    assert drain() == {"succeeded": 2}
    assert traces("leaked_ran") == []


def test_async_orm_inside_the_tenant_scope(traces: Any, tenants: list[Any]) -> None:
    from django_scopes import scopes_disabled

    from project.demo.models import Note

    with scopes_disabled():
        Note.objects.create(tenant=tenants[1], text="other tenant's")
    dispatch("tests.async_note", {"text": "from a coroutine"}, tenant=tenants[0])
    assert drain() == {"succeeded": 1}
    [entry] = traces("async_note")
    assert entry["seen"] == [tenants[0].pk]  # the scope was active inside the coroutine
    with scopes_disabled():
        assert Note.objects.get(pk=entry["note"]).text == "from a coroutine"


def test_coroutines_run_outside_the_main_thread_with_the_callers_context() -> None:
    seen: list[Any] = []

    async def handler(value: int) -> int:
        seen.append((threading.current_thread().name, current_tenant_id()))
        return value * 2

    def in_thread() -> None:
        with tenant_context("t-1"):
            seen.append(run_coroutine(handler, (21,), timeout=1.0, job_name="x"))
        close_thread_loop()

    thread = threading.Thread(target=in_thread, name="worker-thread-1")
    thread.start()
    thread.join()
    assert seen == [("worker-thread-1", "t-1"), 42]


def test_timeout_outside_the_main_thread() -> None:
    import asyncio

    errors: list[BaseException] = []

    def in_thread() -> None:
        try:
            run_coroutine(asyncio.sleep, (5,), timeout=0.05, job_name="tests.sleepy")
        except JobTimeout as exc:
            errors.append(exc)
        finally:
            close_thread_loop()

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(timeout=3)
    assert [str(e) for e in errors] == ["Job 'tests.sleepy' exceeded its timeout of 0.05s and was cancelled."]


def test_a_timeout_error_raised_by_the_handler_is_its_own() -> None:
    async def raises() -> None:
        raise TimeoutError("the partner API timed out")

    with pytest.raises(TimeoutError, match="partner API"):
        run_coroutine(raises, (), timeout=5.0, job_name="x")


def test_called_from_a_running_loop_is_refused_clearly() -> None:
    import asyncio

    async def inner() -> None:
        return None

    async def outer() -> None:
        run_coroutine(inner, (), timeout=None, job_name="tests.nested")

    with pytest.raises(RuntimeError, match="called from a running event loop"):
        asyncio.run(outer())


def test_a_handler_that_blocks_without_awaiting_is_stopped_after_its_timeout(traces: Any) -> None:
    result = dispatch("tests.async_blocking", {"seconds": 5})
    started = time.monotonic()
    assert drain() == {"failed": 1}
    assert time.monotonic() - started < 3  # 0.2 s and the backstop's second, not 5 s
    assert len(traces("async_blocking_start")) == 1 and traces("async_blocking_end") == []
    run = JobRun.objects.get(pk=result.run_id)
    assert run.error == "JobTimeout: Job 'tests.async_blocking' exceeded its timeout of 0.2s and was stopped."


def test_a_database_call_left_running_past_the_timeout_holds_up_nothing(
    traces: Any, settings: Any, tenants: list[Any]
) -> None:
    """The handler awaits a blocking call on its database thread and is cancelled at its timeout;
    the call runs on. Winding the job down (its activator, its connection's tidy) waited for
    that call with no timer, 4 s here, and would have forever; now it gives the database thread
    up after STUCK_AFTER, and the next job gets a new one."""
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "STUCK_AFTER": 0.5}
    result = dispatch("tests.async_db_blocking", {"seconds": 4})
    started = time.monotonic()
    assert drain() == {"failed": 1}
    assert time.monotonic() - started < 2.5  # 0.2 s, then 0.5 s: not the call's 4 s
    run = JobRun.objects.get(pk=result.run_id)
    assert (
        run.error
        == "JobTimeout: Job 'tests.async_db_blocking' exceeded its timeout of 0.2s and was cancelled."
    )
    dispatch("tests.async_note", {"text": "after"}, tenant=tenants[0])
    assert drain() == {"succeeded": 1}
    [note] = traces("async_note")
    assert note["tenant"] == str(tenants[0].pk)


def test_blocking_without_awaiting_in_a_job_thread_is_stopped_and_the_loop_still_works() -> None:
    async def blocks() -> None:
        # Python code that never awaits (a C call that blocks, such as time.sleep, sees the
        # watchdog's exception only when it returns: reported stuck, as for plain handlers).
        end = time.monotonic() + 5
        while time.monotonic() < end:
            pass

    error, seconds, after = _timed_out_then_next_job(blocks, "tests.blocks")
    assert (str(error), seconds < 3, after) == (
        "Job 'tests.blocks' exceeded its timeout of 0.05s and was stopped.",
        True,
        42,
    )


def test_an_interrupted_loop_is_replaced_so_the_old_job_never_resumes() -> None:
    import asyncio

    seen: list[str] = []

    def interrupt() -> None:
        raise KeyboardInterrupt  # what a timer's exception landing in the loop itself looks like

    async def interrupted() -> None:
        asyncio.get_running_loop().call_soon(interrupt)
        try:
            await asyncio.sleep(0.1)
            seen.append("resumed")
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def later() -> None:
        await asyncio.sleep(0.3)  # the old job would resume in here, on the same loop

    def in_thread() -> None:
        try:
            try:
                run_coroutine(interrupted, (), timeout=5.0, job_name="tests.interrupted")
            except KeyboardInterrupt:
                seen.append("interrupted")
            run_coroutine(later, (), timeout=5.0, job_name="tests.later")
        finally:
            close_thread_loop()

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(timeout=10)
    # Cancelled with the old loop, before the exception left run_coroutine; never resumed.
    assert seen == ["cancelled", "interrupted"]


def test_a_task_that_ignores_its_cancellation_holds_up_neither_the_job_nor_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task the handler left running that catches CancelledError and goes on is given up with
    the thread's loop, BACKSTOP seconds after it was cancelled: the job ends, the next job runs
    on a new loop, and the stubborn task never runs inside it."""
    import asyncio

    beats: list[float] = []
    outcomes: list[Any] = []

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
                beats.append(time.monotonic())
            except asyncio.CancelledError:
                continue  # deliberately ignores its cancellation

    async def leaves_one() -> int:
        asyncio.get_running_loop().create_task(stubborn())
        await asyncio.sleep(0.05)
        return 1

    async def later() -> int:
        await asyncio.sleep(0.2)  # the stubborn task would beat in here, on the same loop
        return 2

    def in_thread() -> None:
        try:
            started = time.monotonic()
            outcomes.append(run_coroutine(leaves_one, (), timeout=5.0, job_name="tests.leaves_one"))
            outcomes.append(time.monotonic() - started < 2)  # one BACKSTOP (1 s), not two
            given_up = time.monotonic()
            outcomes.append(run_coroutine(later, (), timeout=5.0, job_name="tests.later"))
            outcomes.append([beat for beat in beats if beat > given_up])
        finally:
            close_thread_loop()

    thread = threading.Thread(target=in_thread, daemon=True)  # a hang must not keep pytest
    thread.start()
    thread.join(timeout=15)
    assert not thread.is_alive(), "the thread hangs on a task that ignores its cancellation"
    assert outcomes == [1, True, 2, []]
    said = [r.getMessage() for r in caplog.records if "ignored their cancellation" in r.getMessage()]
    assert len(said) == 1 and "of tests.leaves_one" in said[0] and "stubborn" in said[0]


def test_a_handler_that_ignores_its_timeout_cancellation_is_stopped_and_its_thread_goes_on() -> None:
    """The handler itself swallows the cancellation of its timeout: the backstop's JobTimeout
    stops it, and closing its loop does not wait on it for good."""
    import asyncio

    async def swallows() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                continue  # deliberately ignores its cancellation

    error, seconds, after = _timed_out_then_next_job(swallows, "tests.swallows")
    # The timeout, then one BACKSTOP (1 s): not a second one waiting on the cancelled handler.
    assert (type(error).__name__, seconds < 2, after) == ("JobTimeout", True, 42)


def test_an_activation_still_entering_when_the_handler_is_cancelled_is_left_with_the_job(
    settings: Any,
) -> None:
    """The handler's first database call enters the activator on the database thread; cancelled
    at its timeout while that is under way, the job must still leave the activation (its schema,
    its scope) instead of handing it on to the thread's next call."""
    from asgiref.sync import sync_to_async

    from tests.testapp import activators

    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "TENANT_ACTIVATOR": "tests.testapp.activators.slow_recorded",
    }
    activators.RECORDED.clear()
    outcomes: list[Any] = []

    async def queries() -> None:
        await sync_to_async(lambda: None)()

    def in_thread() -> None:
        try:
            with tenant_context("t-slow"):
                try:
                    run_coroutine(queries, (), timeout=0.1, job_name="tests.queries")
                except JobTimeout:
                    outcomes.append("timeout")
            outcomes.append(list(activators.RECORDED))
        finally:
            close_thread_loop()

    thread = threading.Thread(target=in_thread, daemon=True)
    thread.start()
    thread.join(timeout=15)
    assert outcomes == ["timeout", [("enter", "t-slow"), ("exit", "t-slow")]]


def _timed_out_then_next_job(handler: Any, job_name: str) -> tuple[BaseException | None, float, Any]:
    """Run ``handler`` with a 0.05 s timeout, then a next job, on one job thread (not the main
    one): the timeout's exception, the seconds until it came, and what the next job returned.
    Fails if the thread is still stuck after 15 s."""
    import asyncio

    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    outcomes: list[Any] = []

    def in_thread() -> None:
        try:
            started = time.monotonic()
            try:
                run_coroutine(handler, (), timeout=0.05, job_name=job_name)
                outcomes.append(None)
            except JobTimeout as exc:
                outcomes.append(exc)
            outcomes.append(time.monotonic() - started)
            outcomes.append(run_coroutine(answer, (), timeout=1.0, job_name="tests.answer"))
        finally:
            close_thread_loop()

    thread = threading.Thread(target=in_thread, daemon=True)  # a hang must not keep pytest
    thread.start()
    thread.join(timeout=15)
    assert not thread.is_alive(), f"the thread of {job_name} hangs"
    error, seconds, after = outcomes
    return error, seconds, after
