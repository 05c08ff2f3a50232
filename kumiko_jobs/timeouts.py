"""Enforce a job's ``timeout`` around the handler.

In the main thread (``runjobs`` with one thread): SIGALRM with sub-second precision, which also
interrupts a blocking call such as ``time.sleep``. An outer ITIMER_REAL timer (pytest-timeout,
a supervisor's own alarm) is not cancelled: the job's timer is armed for whichever comes first,
the outer handler gets its signal when its own deadline passes, and the outer timer is re-armed
with its remaining time afterwards.

In job threads (``--threads N``): signals reach only the main thread, so a watchdog thread
raises ``JobTimeout`` in the job's thread as an asynchronous exception, which Python delivers at
the thread's next bytecode. A handler blocked in C code (a socket read without a timeout, a long
``time.sleep``) does not see it until the call returns; if it is still running ``STUCK_AFTER``
seconds after its deadline the watchdog reports it stuck (the worker then gives up its lease and
recycles the process, see worker.py).
"""

from __future__ import annotations

import ctypes
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

from kumiko_jobs.conf import get_config
from kumiko_jobs.exceptions import JobTimeout

logger = logging.getLogger("kumiko_jobs")
# An outer timer due within this margin after the job's deadline is handled as due now.
_MARGIN = 0.001
# Seconds between the JobTimeouts of a main-thread handler that swallowed the first one.
REPEAT = 1.0


@contextmanager
def enforce_timeout(seconds: float | None, job_name: str, *, shown: float | None = None) -> Iterator[None]:
    """Stop the block after ``seconds`` with JobTimeout (its message names ``shown``, default
    ``seconds``: the job's timeout, when this timer backs up another one)."""
    if not seconds:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        with watchdog().watch(seconds, job_name, shown=shown):
            yield
        return
    start = time.monotonic()
    job_deadline = start + seconds
    previous_handler = signal.getsignal(signal.SIGALRM)
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    outer_deadline = start + outer_delay if outer_delay > 0 else None

    outer_fired = False
    reported = False

    def expire(signum: int, frame: FrameType | None) -> None:
        nonlocal outer_fired
        now = time.monotonic()
        if outer_deadline is not None and not outer_fired and now + _MARGIN >= outer_deadline:
            outer_fired = True
            if now + _MARGIN < job_deadline:
                signal.setitimer(signal.ITIMER_REAL, job_deadline - now)  # the job's own timer
            if callable(previous_handler):
                previous_handler(signum, frame)
            return
        # Again every REPEAT seconds until the block ends: a handler that catches Exception (a
        # loop that logs and goes on) swallowed the one JobTimeout and ran without a limit, its
        # lane's only consumer blocked. Past STUCK_AFTER it is reported stuck, as a job thread's.
        nonlocal reported
        signal.setitimer(signal.ITIMER_REAL, REPEAT)
        if not reported and now >= job_deadline + float(get_config()["STUCK_AFTER"]):
            reported = True
            report_stuck(job_name)
        raise JobTimeout(f"Job {job_name!r} exceeded its timeout of {shown or seconds:g}s and was stopped.")

    signal.signal(signal.SIGALRM, expire)
    first = seconds if outer_deadline is None else min(seconds, outer_delay)
    signal.setitimer(signal.ITIMER_REAL, first)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if outer_deadline is not None and not outer_fired:
            # Give the outer timer back what is left of it (at least a moment, so it still fires).
            remaining = max(outer_deadline - time.monotonic(), _MARGIN)
            signal.setitimer(signal.ITIMER_REAL, remaining, outer_interval)
        elif outer_fired and outer_interval > 0:
            signal.setitimer(signal.ITIMER_REAL, outer_interval, outer_interval)


@dataclass
class _Watch:
    deadline: float
    seconds: float
    job_name: str
    fired: bool = False
    reported: bool = False


class Watchdog(threading.Thread):
    """One per process: times the handlers of job threads (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(name="kumiko-watchdog", daemon=True)
        # Job threads take the C lock itself: a late asynchronous JobTimeout could land inside
        # Condition.__enter__ (Python code) after it acquired the lock and before the with block
        # began, and the lock stayed held, stalling every job thread and the watchdog.
        self._mutex = threading.RLock()
        self._lock = threading.Condition(self._mutex)
        self._watches: dict[int, _Watch] = {}
        # When the watchdog's current wait ends (monotonic; inf: until notified).
        self._wakes_at = float("inf")
        # Called with (thread ident, job name) once per run stuck past its deadline + grace.
        self.on_stuck: Callable[[int, str], None] | None = None

    @contextmanager
    def watch(self, seconds: float, job_name: str, *, shown: float | None = None) -> Iterator[None]:
        ident = threading.get_ident()
        deadline = time.monotonic() + seconds
        mine = _Watch(deadline, shown or seconds, job_name)
        with self._mutex:
            self._watches[ident] = mine
            # Wake the watchdog only for a deadline before its own: a wake per job was two GIL
            # hand-offs more per job among --threads N threads (measured: +10-25 % jobs/s
            # with 8 threads on trivial jobs once gone, with uuid4's system call).
            if deadline < self._wakes_at:
                self._wakes_at = deadline
                self._lock.notify()
        try:
            yield
        finally:
            with self._mutex:
                # Only this watch's entry: a generator finalized late (kept alive by a stored
                # traceback) removed a later job's watch on the same thread, whose timeout then
                # never fired.
                entry = self._watches.pop(ident) if self._watches.get(ident) is mine else None
            if entry is not None and entry.fired:
                # Fired as the handler returned: take back the exception if still undelivered.
                _async_raise(ident, None)

    def run(self) -> None:
        with self._lock:
            while True:
                now = time.monotonic()
                waits = [self._due(ident, entry, now) for ident, entry in list(self._watches.items())]
                pending = [w for w in waits if w is not None]
                timeout = min(pending) if pending else None
                self._wakes_at = float("inf") if timeout is None else now + timeout
                self._lock.wait(timeout)

    def _due(self, ident: int, entry: _Watch, now: float) -> float | None:
        """Act on a watch that is due; return seconds until its next due time, if any."""
        if not entry.fired:
            if now < entry.deadline:
                return entry.deadline - now
            entry.fired = True
            _async_raise(ident, _expired(entry.job_name, entry.seconds))
            logger.warning(
                "kumiko_jobs: %s exceeded its timeout of %gs; stopping it", entry.job_name, entry.seconds
            )
        stuck_at = entry.deadline + float(get_config()["STUCK_AFTER"])
        if entry.reported:
            return None
        if now < stuck_at:
            return stuck_at - now
        entry.reported = True
        if self.on_stuck is not None:
            self.on_stuck(ident, entry.job_name)
        return None


def _expired(job_name: str, seconds: float) -> type[JobTimeout]:
    """A JobTimeout class carrying this run's message: an asynchronous exception is raised from
    its class, without arguments."""
    message = f"Job {job_name!r} exceeded its timeout of {seconds:g}s and was stopped."

    class Expired(JobTimeout):
        def __init__(self) -> None:
            super().__init__(message)

    Expired.__name__ = Expired.__qualname__ = "JobTimeout"
    return Expired


def _async_raise(ident: int, exc: type[BaseException] | None) -> None:
    target = ctypes.py_object(exc) if exc is not None else ctypes.c_void_p(0)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), target)


_watchdog: Watchdog | None = None
_watchdog_lock = threading.Lock()


def report_stuck(job_name: str) -> None:
    """Report the calling thread's job stuck, as the watchdog reports a handler stuck past its
    deadline, where a worker listens (it gives up the run's lease and recycles the process)."""
    dog = _watchdog
    if dog is not None and dog.on_stuck is not None:
        dog.on_stuck(threading.get_ident(), job_name)


def watchdog() -> Watchdog:
    global _watchdog
    with _watchdog_lock:
        if _watchdog is None:
            _watchdog = Watchdog()
            _watchdog.start()
        return _watchdog
