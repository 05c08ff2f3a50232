"""``async def`` handlers: run to completion on an event loop of the thread that runs the job.

Each thread keeps one loop (an ``asyncio.Runner``), made on its first async job and closed by
``close_thread_loop()`` (or at exit). Measured here, an async job costs ~17 µs more than a plain
call (its loop run, context and database-thread context), against ~50 µs more for a loop per
job (``asyncio.run``) and ~280 µs through ``async_to_sync``. No signal and no main thread is
needed, so worker threads can run async handlers too.

The coroutine runs in a copy of the calling context: what was activated around the call (the
tenant, django-scopes' scope, the correlation id, the span) is visible inside it. A timeout
cancels the coroutine and fails the attempt with ``JobTimeout``. Code that blocks without
awaiting never sees the cancellation: the plain handlers' timer (timeouts.py: SIGALRM, or the
watchdog in job threads, which also reports it stuck) stops it ``BACKSTOP`` seconds later, and
the thread's loop is replaced if the timer's exception left work in it. Blocking calls belong in
``sync_to_async``. Tasks a handler
started and left running are cancelled when it returns: nothing leaks into the next job. A task
(or a handler) that catches its CancelledError and goes on is waited for ``BACKSTOP`` seconds,
then given up with the thread's loop, which is closed without it, and logged as an error.

Django's ORM is synchronous. Inside a coroutine use its async methods (``await
Note.objects.acreate(...)``, ``aget``, ``acount``) or ``asgiref.sync.sync_to_async``: during a
job they run on the thread's *database thread*, one helper thread per worker thread with its own
connection, kept between jobs and tidied after each job that used it, like the worker's own
(db_connections.py). A transaction must sit inside one ``sync_to_async`` function. A call
there that outlives its cancelled handler by STUCK_AFTER is given up with its thread, and the
job reported stuck (a worker recycles the process).
``ctx.dispatch`` called inside the loop runs there too (the loop waits for it).
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import logging
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from typing import Any

from asgiref.sync import ThreadSensitiveContext

from kumiko_jobs.conf import get_config
from kumiko_jobs.exceptions import JobTimeout
from kumiko_jobs.tenancy import current_tenant_id, get_activator
from kumiko_jobs.timeouts import enforce_timeout, report_stuck

logger = logging.getLogger("kumiko_jobs")

# Seconds after an async handler's timeout at which the timer of plain handlers stops it, when
# the loop's cancellation did not (a handler that blocks without awaiting). Long enough for a
# cancelled handler's own clean-up to run.
BACKSTOP = 1.0

_local = threading.local()
_threads: list[_JobThread] = []
_threads_lock = threading.Lock()


class _DatabaseThread(ThreadPoolExecutor):
    """The thread a job's ``sync_to_async`` calls run on; remembers whether it was used.

    The job's tenant activator is entered on it before the job's first call there: an activator
    may switch the connection itself (django-tenants sets the schema of the thread's
    connection), and this thread has a connection of its own. Jobs that never touch it pay
    nothing."""

    def __init__(self, owner: str) -> None:
        super().__init__(max_workers=1, thread_name_prefix=f"kumiko-db-{owner}")
        self.used = False  # since the last tidy
        self.started = False
        self._activation: AbstractContextManager[Any] | None = None
        self._active: tuple[contextvars.Context, ExitStack] | None = None

    def activate_on_first_use(self, activation: AbstractContextManager[Any]) -> None:
        self._activation = activation

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.used = self.started = True
        activation, self._activation = self._activation, None
        if activation is None:
            return super().submit(fn, *args, **kwargs)
        # One task: if the activator raises (a tenant that is gone), the call fails with it and
        # nothing runs outside the tenant's schema.
        return super().submit(self._activate_then, activation, fn, *args, **kwargs)

    def wind_down(self) -> Future[None] | None:
        """After a job's last call here: leave its activator and tidy the connection if the job
        used it, as one task behind the job's calls (None: nothing to do)."""
        self._activation = None
        used, self.used = self.used, False
        if not used:
            return None  # no call of the job came here: nothing was activated either

        def run() -> None:
            # Read here, behind the job's calls: a handler cancelled while its first call was
            # still entering the activator left it to be set after wind_down() was called.
            active, self._active = self._active, None
            try:
                if active is not None:
                    # Left in the context it was entered in: a context variable's reset needs it.
                    context, stack = active
                    context.run(stack.close)
            finally:
                from kumiko_jobs.db_connections import tidy_after_job

                tidy_after_job()

        return super().submit(run)

    def _activate_then(
        self, activation: AbstractContextManager[Any], fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        context, stack = contextvars.copy_context(), ExitStack()
        context.run(stack.enter_context, activation)
        self._active = (context, stack)
        return fn(*args, **kwargs)


class _JobThread:
    """What one thread keeps for its async jobs: its loop and its database thread."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self.database = _DatabaseThread(threading.current_thread().name)

    def replace_loop(self, job_name: str) -> None:
        """Close the loop (cancelling what is left in it) and start a new one for the next job."""
        try:
            _close_runner(self.runner, job_name)
        finally:
            self.runner = asyncio.Runner()

    def close(self) -> None:
        _close_runner(self.runner, "")
        if self.database.started:
            from django.db import connections

            self.database.submit(connections.close_all).result()
        self.database.shutdown(wait=True)


def run_coroutine(
    func: Callable[..., Coroutine[Any, Any, Any]],
    args: tuple[Any, ...],
    *,
    timeout: float | None,
    job_name: str,
    kwargs: dict[str, Any] | None = None,
) -> Any:
    """``await func(*args, **kwargs)`` on this thread's loop, within ``timeout`` seconds."""
    if in_event_loop():
        raise RuntimeError(
            f"The async handler of {job_name!r} was called from a running event loop (for example "
            "drain() inside an async test): call it from synchronous code, e.g. "
            "`await sync_to_async(drain)()`."
        )
    job_thread = _this_thread()
    job = _job(func, args, kwargs or {}, timeout, job_name, job_thread.database)
    job_thread.database.activate_on_first_use(get_activator()(current_tenant_id()))
    try:
        with enforce_timeout(timeout + BACKSTOP if timeout else None, job_name, shown=timeout):
            return job_thread.runner.run(job, context=contextvars.copy_context())
    except asyncio.CancelledError as exc:
        # Cancelled from inside (not by our timeout): a failed attempt, never a dead worker.
        raise RuntimeError(f"The async handler of {job_name!r} was cancelled.") from exc
    finally:
        if asyncio.all_tasks(job_thread.runner.get_loop()):
            # The timer's exception landed in the loop itself, not in the handler's task, or a
            # task ignored its cancellation (_cancel_left_running): it would resume inside the
            # next job. Start this thread over with a new loop.
            job_thread.replace_loop(job_name)
        _wind_down(job_thread, job_name)


def _wind_down(job_thread: _JobThread, job_name: str) -> None:
    """Leave the job's activator and tidy its connection on the database thread. A call the job
    left running there (a ``sync_to_async`` call still blocked when the handler was cancelled at
    its timeout) holds that up for as long as it runs, with no timer of its own: after
    STUCK_AFTER the thread is given up, a new one serves the next job, and the job is reported
    stuck, as a plain handler blocked in C code is (a worker recycles the process)."""
    pending = job_thread.database.wind_down()
    if pending is None:
        return
    grace = float(get_config()["STUCK_AFTER"])
    try:
        pending.result(timeout=grace)
    except TimeoutError:
        stuck, job_thread.database = job_thread.database, _DatabaseThread(threading.current_thread().name)
        # Its queue runs once the call returns: the wind-down (in the context it needs), then
        # the connection is closed, and the thread ends.
        from django.db import connections

        stuck.submit(connections.close_all)
        stuck.shutdown(wait=False)
        logger.error(
            "kumiko_jobs: a database call of %s still runs %gs after the handler ended (a blocking "
            "call in sync_to_async, past the job's timeout); its thread is given up",
            job_name,
            grace,
        )
        report_stuck(job_name)


def call_off_loop[T](func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call (database work) from synchronous code that a running event loop
    called: on this thread's database thread, in the caller's context; the loop waits."""
    context = contextvars.copy_context()
    future: Future[T] = _this_thread().database.submit(context.run, func, *args, **kwargs)
    return future.result()


def in_event_loop() -> bool:
    """Whether this thread is inside a running event loop (an async handler's code)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def close_thread_loop() -> None:
    """Close this thread's loop and database thread (a worker thread that stops calls it)."""
    job_thread: _JobThread | None = getattr(_local, "job_thread", None)
    if job_thread is None:
        return
    _local.job_thread = None
    with _threads_lock:
        if job_thread in _threads:
            _threads.remove(job_thread)
    job_thread.close()


def _this_thread() -> _JobThread:
    job_thread: _JobThread | None = getattr(_local, "job_thread", None)
    if job_thread is None:
        job_thread = _JobThread()
        _local.job_thread = job_thread
        with _threads_lock:
            _threads.append(job_thread)
    return job_thread


async def _job(
    func: Callable[..., Coroutine[Any, Any, Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    timeout: float | None,
    job_name: str,
    database: _DatabaseThread,
) -> Any:
    async with ThreadSensitiveContext(executor=database):
        try:
            result = await _bounded(func(*args, **kwargs), timeout, job_name)
        except GeneratorExit:
            raise  # closed unfinished, its loop given up (_close_runner): nothing can be awaited
        except BaseException:
            await _cancel_left_running()
            raise
        await _cancel_left_running()
        return result


async def _bounded(coroutine: Coroutine[Any, Any, Any], timeout: float | None, job_name: str) -> Any:
    if not timeout:
        return await coroutine
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            return await coroutine
    except TimeoutError as exc:
        if scope.expired():  # ours, not a TimeoutError the handler raised itself
            raise JobTimeout(
                f"Job {job_name!r} exceeded its timeout of {timeout:g}s and was cancelled."
            ) from exc
        raise


async def _cancel_left_running() -> None:
    """Cancel the tasks the handler left running and wait BACKSTOP seconds at most for them: one
    that catches its CancelledError and goes on would hold the job (and its thread) for good.
    Such a task is still in the loop afterwards, and run_coroutine replaces the loop."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if not others:
        return
    for task in others:
        task.cancel()
    done, _ = await asyncio.wait(others, timeout=BACKSTOP)
    for task in done:
        if not task.cancelled():
            task.exception()  # retrieved: a left-over task's error is not reported at exit


def _close_runner(runner: asyncio.Runner, job_name: str) -> None:
    """``runner.close()``, bounded: its cancellation waits for every task left in the loop, and
    a task that ignores CancelledError (``except BaseException: continue``) would stall this
    thread for good. Tasks still running BACKSTOP seconds after their cancellation are given up
    with the loop, which is closed without them, and said so."""
    loop = runner.get_loop()
    left = asyncio.all_tasks(loop)
    # Tasks cancelled before and still running ignored it already (_cancel_left_running waited
    # BACKSTOP for them, or the job's timeout cancelled its handler): not waited for again.
    cancelled_before = {task for task in left if task.cancelling()}
    fresh = left - cancelled_before
    for task in fresh:
        task.cancel()
    stubborn = cancelled_before | (_wait_for_tasks(loop, fresh, BACKSTOP) if fresh else set())
    if not stubborn:
        runner.close()
        return
    logger.error(
        "kumiko_jobs: %d task(s) left in the event loop%s ignored their cancellation for %gs "
        "(a handler that catches CancelledError and goes on: %s); the thread's loop is "
        "closed without them",
        len(stubborn),
        f" of {job_name}" if job_name else "",
        BACKSTOP,
        ", ".join(sorted(repr(task.get_coro()) for task in stubborn))[:500],
    )
    for task in stubborn:
        # Closed here, in the task's own context (a context variable's reset needs it), rather
        # than by the garbage collector wherever it runs: its finally clauses run now.
        try:
            task.get_context().run(task.get_coro().close)  # type: ignore[union-attr]
        except Exception:
            logger.exception("kumiko_jobs: closing a task that ignored its cancellation failed")
    asyncio.set_event_loop(None)  # as runner.close() does: the runner had set its loop
    loop.close()


def _wait_for_tasks(
    loop: asyncio.AbstractEventLoop, tasks: set[asyncio.Task[Any]], timeout: float
) -> set[asyncio.Task[Any]]:
    """Run the loop until ``tasks`` are done or ``timeout`` passed; return those still running.
    A future, not ``asyncio.wait``: a task of its own would be cancelled by a cancelled job's
    ``_cancel_left_running``, which takes every other task of the loop for a left-over."""
    waiting = set(tasks)
    waiter: asyncio.Future[None] = loop.create_future()

    def release(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    def ended(task: asyncio.Task[Any]) -> None:
        waiting.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a left-over task's error is not reported at exit
        if not waiting:
            release()

    for task in tasks:
        task.add_done_callback(ended)
    timer = loop.call_later(timeout, release)
    try:
        loop.run_until_complete(waiter)
    finally:
        timer.cancel()
        for task in tasks:
            task.remove_done_callback(ended)
    return waiting


@atexit.register
def _close_all() -> None:
    # A loop garbage-collected unclosed warns (ResourceWarning): close every thread's at exit.
    with _threads_lock:
        job_threads = list(_threads)
        _threads.clear()
    for job_thread in job_threads:
        _close_runner(job_thread.runner, "")
        job_thread.database.shutdown(wait=False)
