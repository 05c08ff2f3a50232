"""Enqueue side: ``dispatch()`` (Lua enqueue + JobRun insert) against RQ's ``Queue.enqueue``.

Both run in this process, on one Redis client, outside any transaction, with the JSON
serializer. Rounds alternate which side goes first, so a warming cache or a busy neighbour
does not always favour the same side.
"""

from __future__ import annotations

import statistics
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
    cpu: dict[str, list[float]] = {ours.label: [], raw.label: []}
    for number in range(rounds):
        for rate, run in sides if number % 2 == 0 else sides[::-1]:
            started, cpu_started = time.perf_counter(), time.process_time()
            run(f"r{number}", count)
            rate.seconds.append(time.perf_counter() - started)
            cpu[rate.label].append(time.process_time() - cpu_started)
    for rate in (ours, raw):
        rate.note += f"; {split_note(rate, cpu[rate.label])}"
    return ours, raw


def split_note(rate: Rate, cpu_seconds: list[float]) -> str:
    """A call's time (the median of the rounds') split into this process's CPU (the median of
    the rounds') and the rest: mostly the wait for Redis' answer and, for dispatch,
    PostgreSQL's, where the two sides differ most."""
    wall = statistics.median(rate.seconds) / rate.jobs
    used = statistics.median(cpu_seconds) / rate.jobs
    return f"{used * 1e6:,.0f} us CPU and {max(wall - used, 0.0) * 1e6:,.0f} us waiting a call"
