"""Enqueue side: ``dispatch()`` (Lua enqueue + JobRun insert) against RQ's ``Queue.enqueue``.

Both run in this process, on one Redis client, outside any transaction, with the JSON
serializer. Rounds alternate which side goes first, so a warming cache or a busy neighbour
does not always favour the same side.

Besides this process's CPU a call, each side's note gives the CPU that Redis and (for
dispatch) this connection's PostgreSQL backend spent for it. On a machine with few cores the
three share them, so the servers' CPU, not only the round trips, is in a call's wall time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from bench.environment import BenchEnv, BenchError
from bench.machine_cpu import process_cpu
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
    servers = {ours.label: ServerCpu(), raw.label: ServerCpu()}
    backend = _backend_pid()
    for number in range(rounds):
        for rate, run in sides if number % 2 == 0 else sides[::-1]:
            before = _server_cpu(client, backend)
            started, cpu_started = time.perf_counter(), time.process_time()
            run(f"r{number}", count)
            rate.seconds.append(time.perf_counter() - started)
            cpu[rate.label].append(time.process_time() - cpu_started)
            servers[rate.label].add(before, _server_cpu(client, backend))
    if backend is not None and _backend_pid() != backend:
        servers[ours.label].postgres = None  # a new connection: its backend's CPU is unknown
    for rate in (ours, raw):
        rate.note += f"; {split_note(rate, cpu[rate.label])}"
        rate.note += servers[rate.label].note(rate.jobs * rounds, postgres=rate is ours)
    return ours, raw


class ServerCpu:
    """Seconds of CPU the servers spent over one side's rounds, summed (a round of a few hundred
    calls is a few of the kernel's 10 ms ticks of the backend's CPU: the sum is what is exact)."""

    def __init__(self) -> None:
        self.redis = 0.0
        self.postgres: float | None = 0.0

    def add(self, before: tuple[float, float | None], after: tuple[float, float | None]) -> None:
        self.redis += after[0] - before[0]
        if self.postgres is not None and before[1] is not None and after[1] is not None:
            self.postgres += after[1] - before[1]
        else:
            self.postgres = None

    def note(self, calls: int, *, postgres: bool) -> str:
        parts = [f"Redis {self.redis / calls * 1e6:,.0f} us"]
        if postgres:
            from django.db import connection

            if connection.vendor != "postgresql":
                parts.append(f"{connection.vendor} works in this process")
            elif self.postgres is None:
                parts.append("its PostgreSQL backend unknown (on another host, or replaced meanwhile)")
            else:
                parts.append(f"its PostgreSQL backend {self.postgres / calls * 1e6:,.0f} us")
        return f"; CPU a call besides this process: {', '.join(parts)}"


def _backend_pid() -> int | None:
    """The PostgreSQL backend serving this process's connection, when it runs on this machine;
    None otherwise."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = int(cursor.fetchone()[0])
    try:
        # A database on another host has its own pids: the same number here is someone else.
        local = Path(f"/proc/{pid}/comm").read_text().startswith("postgres")
    except OSError:
        local = False
    return pid if local else None


def _server_cpu(client: redis.Redis, backend: int | None) -> tuple[float, float | None]:
    """Redis' CPU seconds (INFO cpu: the whole server, which only the bench uses) and the
    backend's."""
    info = client.info("cpu")
    return (
        float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        None if backend is None else process_cpu(backend),
    )


def split_note(rate: Rate, cpu_seconds: list[float]) -> str:
    """A call's time (the median of the rounds') split into this process's CPU (the median of
    the rounds') and the rest: mostly the wait for Redis' answer and, for dispatch,
    PostgreSQL's, where the two sides differ most."""
    wall = statistics.median(rate.seconds) / rate.jobs
    used = statistics.median(cpu_seconds) / rate.jobs
    return f"{used * 1e6:,.0f} us CPU and {max(wall - used, 0.0) * 1e6:,.0f} us waiting a call"
