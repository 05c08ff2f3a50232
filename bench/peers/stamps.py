"""The task bodies of the peers section and the one Redis call each of them ends with.

Every system in the section (runjobs, RQ, Dramatiq, Celery) runs these same functions, so each
pays the same one ``RPUSH`` of ``"<index> <start> <end>"`` per job onto the round's list, and
every rate comes from one method: jobs / (last end - first start) over those stamps. The job
whose push completes the list also pushes to ``<list>:done``, which the bench waits on with
BLPOP to stop the Dramatiq and Celery workers (they have no burst mode) without polling.
No Django: the peers' worker processes import this as it is.
"""

from __future__ import annotations

import functools
import os
import time

import redis

IO_SECONDS = 0.02


def redis_url() -> str:
    return os.environ.get("KUMIKO_REDIS_URL", "redis://127.0.0.1:6379/0")


def bench_prefix() -> str:
    """The bench's key prefix: every key and queue name of a peer carries it (clean-up by SCAN)."""
    try:
        return os.environ["KUMIKO_QUEUE_PREFIX"]
    except KeyError:
        raise RuntimeError(
            "KUMIKO_QUEUE_PREFIX is not set: the peers' task modules are started by `python -m bench`, "
            "which sets it (and KUMIKO_REDIS_URL) for every worker it runs"
        ) from None


def done_key(stamps: str) -> str:
    return f"{stamps}:done"


@functools.cache
def redis_client() -> redis.Redis:
    # One client (and connection pool, thread-safe) per process, made on the first job.
    return redis.Redis.from_url(redis_url())


def record(stamps: str, expected: int, index: int, started: float) -> None:
    ended = time.time()
    client = redis_client()
    if client.rpush(stamps, f"{index} {started:.6f} {ended:.6f}") == expected:
        client.rpush(done_key(stamps), "1")


def trivial(stamps: str, expected: int, index: int) -> None:
    """Nothing but the stamp."""
    record(stamps, expected, index, time.time())


def io20(stamps: str, expected: int, index: int) -> None:
    """An I/O-bound job: 20 ms of waiting (the GIL is free meanwhile), then the stamp."""
    started = time.time()
    time.sleep(IO_SECONDS)
    record(stamps, expected, index, started)
