"""Enforce a job's ``timeout`` around the handler (SIGALRM with sub-second precision)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from kumiko_jobs.exceptions import JobTimeout

logger = logging.getLogger("kumiko_jobs")


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

    def expire(signum: int, frame: FrameType | None) -> None:
        raise JobTimeout(f"Job {job_name!r} exceeded its timeout of {seconds:g}s and was stopped.")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
