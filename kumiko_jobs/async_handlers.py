"""``async def`` handlers: run to completion on an event loop of the thread that runs the job.

Each thread keeps one loop (an ``asyncio.Runner``), made on its first async job and closed at
exit or by ``close_thread_loop()``: measured here, a job costs ~10 µs on a kept loop against
~50 µs for a loop per job (``asyncio.run``). No signal and no main thread is needed, so worker
threads can run async handlers too.

The coroutine runs in a copy of the calling context: what was activated around the call (the
tenant, django-scopes' scope, the correlation id, the span) is visible inside it. A timeout
cancels the coroutine and fails the attempt with ``JobTimeout``; code that blocks without
awaiting cannot be cancelled, so blocking calls belong in ``sync_to_async``. Tasks a handler
started and left running are cancelled when it returns: nothing leaks into the next job.

Django's ORM is synchronous: inside a coroutine use its async methods (``await
Note.objects.acreate(...)``, ``aget``, ``acount``) or ``asgiref.sync.sync_to_async``. Both run
the query in asgiref's thread, on that thread's database connection, so a transaction must
sit inside one ``sync_to_async`` function.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kumiko_jobs.exceptions import JobTimeout

_local = threading.local()
_runners: list[asyncio.Runner] = []
_runners_lock = threading.Lock()
# Blocking calls made from inside a running loop (ctx.dispatch in an async handler) run here:
# Django refuses database work in a thread whose event loop is running.
_off_loop = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kumiko-off-loop")


def run_coroutine(
    func: Callable[..., Coroutine[Any, Any, Any]],
    args: tuple[Any, ...],
    *,
    timeout: float | None,
    job_name: str,
    kwargs: dict[str, Any] | None = None,
) -> Any:
    """``await func(*args, **kwargs)`` on this thread's loop, within ``timeout`` seconds."""
    if _loop_running():
        raise RuntimeError(
            f"The async handler of {job_name!r} was called from a running event loop (for example "
            "drain() inside an async test): call it from synchronous code, e.g. "
            "`await sync_to_async(drain)()`."
        )
    runner = _thread_runner()
    try:
        return runner.run(
            _bounded(func, args, kwargs or {}, timeout, job_name), context=contextvars.copy_context()
        )
    except asyncio.CancelledError as exc:
        # Cancelled from inside (not by our timeout): a failed attempt, never a dead worker.
        raise RuntimeError(f"The async handler of {job_name!r} was cancelled.") from exc
    finally:
        _cancel_leftovers(runner)


def call_off_loop[T](func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call from synchronous code that a running event loop called (it waits,
    and the loop waits with it); in the caller's context, so tenant and correlation id carry."""
    context = contextvars.copy_context()
    return _off_loop.submit(context.run, func, *args, **kwargs).result()


def in_event_loop() -> bool:
    """Whether this thread is inside a running event loop (an async handler's code)."""
    return _loop_running()


def close_thread_loop() -> None:
    """Close this thread's loop (a worker thread that stops calls it)."""
    runner = getattr(_local, "runner", None)
    if runner is not None:
        _local.runner = None
        with _runners_lock:
            if runner in _runners:
                _runners.remove(runner)
        runner.close()


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _thread_runner() -> asyncio.Runner:
    runner: asyncio.Runner | None = getattr(_local, "runner", None)
    if runner is None:
        runner = asyncio.Runner()
        _local.runner = runner
        with _runners_lock:
            _runners.append(runner)
    return runner


async def _bounded(
    func: Callable[..., Coroutine[Any, Any, Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    timeout: float | None,
    job_name: str,
) -> Any:
    if not timeout:
        return await func(*args, **kwargs)
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            return await func(*args, **kwargs)
    except TimeoutError as exc:
        if scope.expired():  # ours, not a TimeoutError the handler raised itself
            raise JobTimeout(
                f"Job {job_name!r} exceeded its timeout of {timeout:g}s and was cancelled."
            ) from exc
        raise


def _cancel_leftovers(runner: asyncio.Runner) -> None:
    loop = runner.get_loop()
    pending = asyncio.all_tasks(loop)
    if not pending:
        return
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


@atexit.register
def _close_all() -> None:
    # A loop garbage-collected unclosed warns (ResourceWarning); close every thread's at exit.
    with _runners_lock:
        runners = list(_runners)
        _runners.clear()
    for runner in runners:
        runner.close()
    _off_loop.shutdown(wait=False)
