"""Enqueue side: ``dispatch()`` (Lua enqueue + JobRun insert) against RQ's ``Queue.enqueue``.

Both run in this process, on one Redis client, outside any transaction, with the JSON
serializer. Rounds alternate which side goes first, so a warming cache or a busy neighbour
does not always favour the same side.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rq import Queue
from rq.serializers import JSONSerializer

from bench.environment import BenchEnv, BenchError
from bench.results import Rate
from bench.rqtasks import noop

WARM_UP = 50


def measure_dispatch(env: BenchEnv, count: int, rounds: int) -> tuple[Rate, Rate]:
    from django.db import connection

    from kumiko_jobs import dispatch
    from kumiko_jobs.connection import get_redis

    if connection.in_atomic_block:
        raise BenchError("dispatch must be measured outside a transaction")
    client = get_redis()
    raw_queue = Queue(f"{env.prefix}_raw_enqueue", connection=client, serializer=JSONSerializer)
    ours = Rate("dispatch()", count, note="Lua enqueue + JobRun INSERT")
    raw = Rate("rq Queue.enqueue", count, note="same function shape, JSON")

    def run_ours(tag: str, n: int) -> None:
        for i in range(n):
            dispatch("bench.noop", {"i": i}, tenant=env.tenant_id)

    def run_raw(tag: str, n: int) -> None:
        # Ids carry the prefix so the clean-up finds the job hashes; RQ's own would be uuid4s.
        for i in range(n):
            raw_queue.enqueue(noop, i, job_id=f"{env.prefix}_{tag}_{i}")

    # Warm-up: DB connection, script loading, tenant cache, queue registration.
    run_ours("warm", WARM_UP)
    run_raw("warm", WARM_UP)
    sides: list[tuple[Rate, Callable[[str, int], None]]] = [(ours, run_ours), (raw, run_raw)]
    for number in range(rounds):
        for rate, run in sides if number % 2 == 0 else sides[::-1]:
            started = time.perf_counter()
            run(f"r{number}", count)
            rate.seconds.append(time.perf_counter() - started)
    return ours, raw
