"""Django's ``Task.enqueue()`` on KumikoTaskBackend against ``dispatch()`` of the same work.

Both sides go through the same dispatch path (validation, the run row, the Lua enqueue, one
round trip's wait); ``.enqueue()`` adds Django's own work (the Task's validation, the
``TaskResult`` it returns, ``task_enqueued``) and an ordered flow (a sorted set) for the
priority. Same process, same tenant, outside any transaction; rounds alternate which side goes
first, as bench/dispatch_rate.py does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bench.environment import BenchEnv, BenchError
from bench.results import Rate

WARM_UP = 50


def measure_tasks(env: BenchEnv, count: int, rounds: int) -> tuple[Rate, Rate]:
    from django.db import connection

    from bench.benchapp.tasks import noop
    from kumiko_jobs import dispatch
    from kumiko_jobs.tenancy import tenant_context

    if connection.in_atomic_block:
        raise BenchError("enqueue must be measured outside a transaction")
    ours = Rate("Task.enqueue()", count, note="django.tasks on KumikoTaskBackend, one tenant")
    plain = Rate("dispatch() (same run)", count, note="kumiko's own API, same tenant and args")

    def run_tasks(n: int) -> None:
        with tenant_context(env.tenant_id):
            for i in range(n):
                noop.enqueue(i)

    def run_dispatch(n: int) -> None:
        for i in range(n):
            dispatch("bench.noop", {"i": i}, tenant=env.tenant_id)

    run_tasks(WARM_UP)
    run_dispatch(WARM_UP)
    sides: list[tuple[Rate, Callable[[int], None]]] = [(ours, run_tasks), (plain, run_dispatch)]
    for number in range(rounds):
        for rate, run in sides if number % 2 == 0 else sides[::-1]:
            started = time.perf_counter()
            run(count)
            rate.seconds.append(time.perf_counter() - started)
    return ours, plain
