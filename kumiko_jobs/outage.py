"""Waiting out a Redis outage (a restart, a failover, a network cut) instead of dying: the
worker retries with exponential backoff and says once when the outage starts and when it ends."""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("kumiko_jobs.worker")
FIRST_DELAY = 0.1
MAX_DELAY = 5.0


class RedisOutage:
    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.since: float | None = None
        self.delay = FIRST_DELAY

    def wait(self, error: Exception) -> None:
        """Sleep before the next try (a second SIGTERM still stops the worker at once)."""
        if self.since is None:
            self.since = time.monotonic()
            logger.warning("worker %s: Redis unreachable (%s); retrying with backoff", self.worker, error)
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, MAX_DELAY)

    def over(self) -> None:
        if self.since is not None:
            logger.warning("worker %s: Redis is back after %.1fs", self.worker, time.monotonic() - self.since)
        self.since, self.delay = None, FIRST_DELAY
