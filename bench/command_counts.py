"""Redis commands per job, from ``INFO commandstats`` (CONFIG RESETSTAT before each side).

commandstats also counts the commands a Lua script runs, under their own names, so a script
call shows up as one EVALSHA (one round trip) plus its inner commands. The counts are taken on
a private redis-server when one is on PATH: CONFIG RESETSTAT and INFO are server-wide, and on
a shared Redis other clients' commands (a test run next door) would land in our totals.

The worker side is counted twice: a burst ``runjobs`` on the empty lane (start-up, the first
empty claim, shutdown), then one on the queued jobs; the difference divided by the jobs is what
an executed job costs (the per-job target), the second count alone what a short burst run costs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Callable, Iterator

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from bench.children import RUNJOBS
from bench.environment import BenchEnv
from bench.filling import fill_rq_queue
from bench.results import CommandCount
from bench.rqtasks import noop

# The bench's own probes, not part of what is measured.
OWN_COMMANDS = frozenset({"info", "config|resetstat", "ping"})
SCRIPT_COMMANDS = frozenset({"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"})
WARM_UP = 10
TARGET_PER_JOB = 10.0  # dispatch() per queued job, runjobs per executed job


@contextlib.contextmanager
def counting_redis(env: BenchEnv) -> Iterator[tuple[str, str]]:
    """(url, description) of the Redis to count on: private if possible, else the shared one."""
    executable = shutil.which("redis-server")
    if executable is None:
        yield env.redis_url, "shared Redis (no redis-server on PATH): other clients' commands may be counted"
        return
    from scripts.with_redis import start_redis_server

    with contextlib.ExitStack() as stack:
        yield start_redis_server(executable, stack), "private redis-server started for the count"


@contextlib.contextmanager
def kumiko_on(url: str) -> Iterator[None]:
    """Point this process's kumiko_jobs at ``url`` (settings change resets its cached client)."""
    from django.conf import settings
    from django.test import override_settings

    with override_settings(KUMIKO_JOBS={**settings.KUMIKO_JOBS, "REDIS_URL": url}):
        yield


def count_commands(client: redis.Redis, label: str, jobs: int, action: Callable[[], object]) -> CommandCount:
    client.config_resetstat()
    action()
    stats = client.info("commandstats")
    calls = {
        name.removeprefix("cmdstat_"): int(values["calls"])
        for name, values in stats.items()
        if name.removeprefix("cmdstat_") not in OWN_COMMANDS
    }
    top = sorted(calls.items(), key=lambda item: item[1], reverse=True)
    return CommandCount(
        label,
        jobs,
        total=sum(calls.values()),
        scripts=sum(calls.get(name, 0) for name in SCRIPT_COMMANDS),
        top=top,
    )


def per_executed_job(run: CommandCount, fixed: CommandCount, label: str) -> CommandCount:
    """``run`` minus the ``fixed`` cost of a run with nothing to do, over ``run``'s jobs. The
    total is exact; the listed commands leave out differences under one call per 100 jobs (a
    periodic upkeep call more or less in one of the two runs), which would read as noise."""
    calls = dict(run.top)
    for name, count in fixed.top:
        calls[name] = calls.get(name, 0) - count
    listed = ((name, n) for name, n in calls.items() if abs(n) * 100 >= run.jobs)
    top = sorted(listed, key=lambda item: item[1], reverse=True)
    return CommandCount(
        label,
        run.jobs,
        total=run.total - fixed.total,
        scripts=run.scripts - fixed.scripts,
        top=top,
        target=TARGET_PER_JOB,
    )


def measure_commands(env: BenchEnv, count: int) -> tuple[list[CommandCount], str]:
    from kumiko_jobs import dispatch

    results: list[CommandCount] = []
    with counting_redis(env) as (url, where), kumiko_on(url):
        client = redis.Redis.from_url(url)

        def dispatch_all(n: int, tag: str) -> list[str]:
            return [
                str(
                    dispatch(
                        "bench.noop", {"i": i}, tenant=env.tenant_id, correlation_id=f"{env.prefix}_{tag}"
                    ).job_id
                )
                for i in range(n)
            ]

        def run_worker() -> None:
            env.run_child(RUNJOBS, timeout=60 + count / 20, KUMIKO_REDIS_URL=url)

        fixed = count_commands(client, "runjobs on the empty lane", 1, run_worker)
        # Script loading and queue registration happen once per process: keep them out.
        dispatch_all(WARM_UP, "cmd_warm")
        enqueue = count_commands(
            client, "dispatch() (enqueue side)", count, lambda: dispatch_all(count, "cmd")
        )
        results.append(dataclasses.replace(enqueue, target=TARGET_PER_JOB))
        worker = count_commands(client, "runjobs (worker side, incl. start-up)", count + WARM_UP, run_worker)
        results.append(per_executed_job(worker, fixed, "runjobs (worker side, per executed job)"))
        results.append(worker)

        queue = Queue(f"{env.prefix}_rq_cmd", connection=client, serializer=JSONSerializer)
        for i in range(WARM_UP):
            queue.enqueue(noop, i, job_id=f"{env.prefix}_cmd_warm_{i}")

        def enqueue_all() -> None:
            for i in range(count):
                queue.enqueue(noop, i, job_id=f"{env.prefix}_cmd_{i}")

        results.append(count_commands(client, "rq Queue.enqueue", count, enqueue_all))
        simple_queue = f"{env.prefix}_rq_cmd_simple"
        fill_rq_queue(client, simple_queue, count)
        results.append(
            count_commands(
                client,
                "rq SimpleWorker",
                count,
                lambda: env.run_child(
                    ("-m", "bench.rqworker", "simple", simple_queue, f"{simple_queue}_worker"),
                    timeout=60 + count / 5,
                    KUMIKO_REDIS_URL=url,
                ),
            )
        )
        client.close()
    return results, where
