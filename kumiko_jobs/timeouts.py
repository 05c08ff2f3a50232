"""Enforce a job's ``timeout`` around the handler (SIGALRM with sub-second precision).

An outer ITIMER_REAL timer (pytest-timeout, a supervisor's own alarm) is not cancelled: the
job's timer is armed for whichever comes first, the outer handler gets its signal when its own
deadline passes, and the outer timer is re-armed with its remaining time afterwards.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from kumiko_jobs.exceptions import JobTimeout

logger = logging.getLogger("kumiko_jobs")
# An outer timer due within this margin after the job's deadline is handled as due now.
_MARGIN = 0.001


@contextmanager
def enforce_timeout(seconds: float | None, job_name: str) -> Iterator[None]:
    if not seconds:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        # Signals reach only the main thread; workers run jobs there, helpers may not.
        logger.warning("kumiko_jobs: timeout of %s not enforced outside the main thread", job_name)
        yield
        return
    start = time.monotonic()
    job_deadline = start + seconds
    previous_handler = signal.getsignal(signal.SIGALRM)
    outer_delay, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    outer_deadline = start + outer_delay if outer_delay > 0 else None

    outer_fired = False

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
        raise JobTimeout(f"Job {job_name!r} exceeded its timeout of {seconds:g}s and was stopped.")

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
