"""Waiting out an outage of Redis or of the database (a restart, a failover, a network cut)
instead of dying or moving on: the worker retries with exponential backoff and says once when
the outage starts and when it ends."""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("kumiko_jobs.worker")
FIRST_DELAY = 0.1
MAX_DELAY = 5.0


class Outage:
    """One outage of ``what`` as ``who`` sees it: the backoff between tries, and two log lines."""

    def __init__(self, who: str, what: str) -> None:
        self.who, self.what = who, what
        self.since: float | None = None
        self.delay = FIRST_DELAY

    def wait(self, error: BaseException | str) -> None:
        """Sleep before the next try (a second SIGTERM still stops the worker at once)."""
        if self.since is None:
            self.since = time.monotonic()
            logger.warning("%s: %s unreachable (%s); retrying with backoff", self.who, self.what, error)
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, MAX_DELAY)

    def over(self) -> None:
        if self.since is not None:
            logger.warning("%s: %s is back after %.1fs", self.who, self.what, time.monotonic() - self.since)
        self.since, self.delay = None, FIRST_DELAY


class RedisOutage(Outage):
    def __init__(self, worker: str) -> None:
        super().__init__(f"worker {worker}", "Redis")
