"""Chaos: SIGKILLed workers, a Redis restart that loses everything, processes killed between
COMMIT and push, a reaper killed mid-recovery, poison jobs. Each test prints its figures (lost,
duplicated executions, wrong final states, recovery time) and requires 0 lost and 0 wrong."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import connection, transaction

from kumiko_jobs import QueueUnavailable, dispatch
from kumiko_jobs.claiming import PREFETCH_PER_THREAD
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from tests.integration.chaos import ABANDON_AFTER, CHAOS_ENV, Ledger, RecordProperty, figures_of
from tests.integration.redis_servers import RedisServer, free_port
from tests.integration.support import REPO_ROOT, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.txt")


@pytest.fixture
def chaos_workers(start_worker: Any, ledger: Ledger) -> Any:
    """``start_worker`` with the short lease and the ledger."""
    chaos_env = {**CHAOS_ENV, "KUMIKO_CHAOS_LEDGER": str(ledger.path)}

    def start(lane: str = "worker", *args: str, env: dict[str, str] | None = None, wait: bool = True) -> Any:
        return start_worker(lane, *args, env={**chaos_env, **(env or {})}, wait=wait)

    return start


THREADED = ("worker", "--threads", "4")


def dispatch_many(count: int, ms: float = 5.0, **options: Any) -> list[str]:
    with transaction.atomic():
        return [str(dispatch("tests.chaos_work", {"i": i, "ms": ms}, **options).run_id) for i in range(count)]


def test_sigkill_loop_loses_nothing_and_recovers_within_the_lease(
    chaos_workers: Any, ledger: Ledger, record_property: RecordProperty
) -> None:
    rng = random.Random(8)
    run_ids = dispatch_many(1000, ms=20)
    # One of them, and every replacement, a --threads worker: its ready jobs die with it too
    # (claiming.py).
    workers = [chaos_workers(*(THREADED if n == 0 else ())) for n in range(3)]
    kills: list[float] = []
    for _ in range(6):
        time.sleep(rng.uniform(0.8, 1.6))
        victim = workers.pop(rng.randrange(len(workers)))
        victim.kill_group()
        kills.append(time.time())
        workers.append(chaos_workers(*THREADED))
    figures = figures_of("sigkill loop (3 workers, 6 kills, 1000 jobs of 20 ms)", run_ids, ledger, 120)
    # Recovery: a run whose execution a kill interrupted starts again within the lease + 10 s.
    lines = ledger.lines()
    ends = {(run_id, pid) for event, run_id, _a, pid, _t in lines if event == "end"}
    interrupted = [
        (run_id, at) for event, run_id, _a, pid, at in lines if event == "start" and (run_id, pid) not in ends
    ]
    recoveries = []
    for run_id, at in interrupted:
        later = [t for event, r, _a, _p, t in lines if event == "start" and r == run_id and t > at]
        recoveries.append(min(later) - at if later else float("inf"))
    figures.extra.update(
        kills=len(kills), interrupted=len(interrupted), max_recovery_s=round(max(recoveries, default=0), 1)
    )
    figures.report(record_property)
    assert (figures.lost, figures.wrong_final) == (0, 0)
    assert max(recoveries, default=0) <= ABANDON_AFTER + 10


@pytest.fixture
def private_redis(tmp_path: Path, settings: Any) -> Any:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"

    def start() -> RedisServer:
        server = RedisServer(tmp_path / f"redis-{time.monotonic_ns()}", f"port {port}\n")
        server.wait_ready(redis.Redis.from_url(url))
        return server

    servers = [start()]
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "REDIS_URL": url, "REDIS_TIMEOUT": 1.0}

    class Private:
        def restart_empty(self) -> float:
            """SHUTDOWN NOSAVE, then a fresh server on the same port; returns the downtime."""
            began = time.monotonic()
            self.shut_down()
            time.sleep(1.0)
            self.start_again()
            return time.monotonic() - began

        def shut_down(self) -> None:
            try:
                redis.Redis.from_url(url).shutdown(nosave=True)
            except redis.ConnectionError:
                pass  # SHUTDOWN closes the connection before it answers
            servers[-1].proc.wait(10)

        def start_again(self) -> None:
            servers.append(start())

    yield url, Private()
    for server in servers:
        server.stop()


def test_redis_restart_without_persistence_under_load_loses_nothing(
    chaos_workers: Any, ledger: Ledger, private_redis: Any, record_property: RecordProperty
) -> None:
    url, server = private_redis
    env = {"KUMIKO_REDIS_URL": url}
    # One a --threads worker: its claimer waits the outage out with the finishes it holds.
    workers = [chaos_workers(*(THREADED if n == 0 else ()), env=env, wait=False) for n in range(2)]
    # Both up before Redis goes: a runjobs that meets no Redis at its start fails fast (exit 1),
    # and on a loaded machine one still starting met the restart.
    wait_until(lambda: all("consuming lane" in w.output() for w in workers), 60, "both workers up")
    accepted: list[str] = []
    refused = 0
    downtime: list[float] = []
    restart = threading.Thread(target=lambda: downtime.append(server.restart_empty()))
    i = 0
    while len(accepted) < 1000:  # a caller whose dispatch was refused tries again
        i += 1
        if i == 300:  # a backlog is queued (10 ms jobs, 2 workers): it is lost with Redis' memory
            restart.start()
        try:
            if i % 2:
                with transaction.atomic():  # committed rows wait for Redis: never refused
                    accepted.append(str(dispatch("tests.chaos_work", {"i": i, "ms": 10}).run_id))
            else:
                accepted.append(str(dispatch("tests.chaos_work", {"i": i, "ms": 10}).run_id))
        except QueueUnavailable:
            refused += 1  # Redis was down: dispatch said so and recorded nothing
        time.sleep(0.003)
    restart.join()
    figures = figures_of("redis SHUTDOWN NOSAVE + restart under load", accepted, ledger, 120)
    repushed = sum(int(n) for w in workers for n in re.findall(r"pushed (\d+) run\(s\) again", w.output()))
    figures.extra.update(refused_while_down=refused, downtime_s=round(downtime[0], 1), pushed_again=repushed)
    figures.report(record_property)
    assert all(worker.proc.poll() is None for worker in workers), "a worker died of the outage"
    assert (figures.lost, figures.wrong_final) == (0, 0)
    assert refused > 0 and repushed > 0  # the outage hit dispatches, and Redis lost queued runs


def test_a_supervisor_rides_out_a_redis_outage_while_it_restarts_a_worker_process(
    start_worker: Any, private_redis: Any, kumiko_prefix: str
) -> None:
    """A child started while Redis is down (it crashed, or was recycled, during the outage)
    waits for Redis as a running worker does. Before, each start failed at once, and after five
    the supervisor stopped the lane's other children too and exited 1, as for a broken deploy;
    under systemd its restarts then failed the same way until the unit gave up."""
    url, server = private_redis
    client = redis.Redis.from_url(url)
    supervisor = start_worker("worker", "--processes", "2", env={"KUMIKO_REDIS_URL": url}, wait=False)
    names = [f"{kumiko_prefix}-worker-1-p{slot}" for slot in (1, 2)]
    wait_until(lambda: all(client.sismember(get_keys().claimers("worker"), n) for n in names), 30, "children")
    child = int(client.hget(f"rq:worker:{names[0]}", "pid") or 0)
    server.shut_down()
    os.kill(child, signal.SIGKILL)  # a crash during the outage: the supervisor starts another
    # Longer than five failed starts with their backoff (1 + 2 + 4 + 8 s) take.
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline:
        assert supervisor.proc.poll() is None, supervisor.output()
        time.sleep(0.5)
    assert "Redis unreachable" in supervisor.output()
    server.start_again()
    # The new child joins the emptied Redis as it starts (the other one at its next heartbeat).
    wait_until(lambda: client.sismember(get_keys().claimers("worker"), names[0]), 30, "the new child")
    run = dispatch("tests.chaos_work", {"i": 0, "ms": 1})
    wait_until(
        lambda: JobRun.objects.filter(pk=run.run_id, status=RunStatus.SUCCEEDED).exists(), 30, "the run"
    )
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0


def test_workers_register_again_after_redis_lost_its_data(
    start_worker: Any, private_redis: Any, kumiko_prefix: str
) -> None:
    """Operators count a lane's workers on django-rq's dashboard (RQ's worker registry) and in
    the lane's claimers set: a worker that rode out a Redis restart without persistence must be
    listed again, with its queue, not only keep working."""
    from rq import Worker

    url, server = private_redis
    client = redis.Redis.from_url(url)
    worker = start_worker(
        "worker", env={"KUMIKO_REDIS_URL": url, "KUMIKO_TEST_HEARTBEAT_INTERVAL": "1"}, wait=False
    )
    name = f"{kumiko_prefix}-worker-1"
    queue = get_keys().queue_name("worker")

    def listed() -> bool:
        workers = {w.name: w for w in Worker.all(connection=client)}
        return (
            client.sismember(get_keys().claimers("worker"), name)
            and name in workers
            and workers[name].queue_names() == [queue]
            and workers[name].pid == worker.pid
        )

    wait_until(listed, 30, "the worker listed")
    # In its loop, past start-up (a Redis gone between registering and the loop ends start-up).
    first = dispatch("tests.chaos_work", {"i": 1, "ms": 1})
    wait_until(
        lambda: JobRun.objects.filter(pk=first.run_id, status=RunStatus.SUCCEEDED).exists(), 30, "a run"
    )
    server.restart_empty()
    # Not "assert not listed()" here: the heartbeat may have listed it again already.
    wait_until(listed, 15, "the worker listed again")
    wait_until(
        lambda: "Redis had lost this worker's registration; registered again" in worker.output(),
        5,
        "the worker's word that it registered again",
    )
    run = dispatch("tests.chaos_work", {"i": 0, "ms": 1})
    wait_until(
        lambda: JobRun.objects.filter(pk=run.run_id, status=RunStatus.SUCCEEDED).exists(), 30, "the run"
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert not client.sismember(get_keys().claimers("worker"), name)


def test_a_database_outage_under_load_loses_nothing(
    chaos_workers: Any, ledger: Ledger, record_property: RecordProperty
) -> None:
    """PostgreSQL drops every worker connection and refuses new ones for a while (a restart, a
    failover): the workers ride it out, every run ends succeeded, recorded as such, none ran
    twice, and the workers ran few jobs meanwhile."""
    if connection.vendor != "postgresql":
        pytest.skip("an outage of PostgreSQL: the test refuses connections to its database")
    run_ids = dispatch_many(600, ms=10)
    workers = [chaos_workers(*(THREADED if n == 0 else ())) for n in range(2)]
    wait_until(lambda: len(ledger.lines()) >= 200, 60, "the workers to be busy")
    import psycopg

    settings = connection.settings_dict
    name, own = settings["NAME"], connection.connection.info.backend_pid
    began = time.monotonic()
    # From the maintenance database: PostgreSQL will not close the one a session is in.
    with psycopg.connect(
        dbname="postgres", host=settings["HOST"], port=settings["PORT"] or 5432,
        user=settings["USER"], password=settings["PASSWORD"], autocommit=True,
    ) as admin:  # fmt: skip
        try:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            row = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> %s",
                (name, own),
            ).fetchone()
            dropped = row[0] if row else 0
            down_from = time.time()
            time.sleep(8)
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    down_to, downtime = time.time(), time.monotonic() - began
    figures = figures_of("PostgreSQL refusing connections under load", run_ids, ledger, 120)
    # Runs the --threads worker started while its successes could not be written.
    started_meanwhile = sum(
        1
        for event, _run, _attempt, pid, at in ledger.lines()
        if event == "start" and pid == workers[0].pid and down_from + 1 < at < down_to
    )
    figures.extra.update(
        downtime_s=round(downtime, 1), connections_dropped=dropped, thread_starts_meanwhile=started_meanwhile
    )
    figures.report(record_property)
    assert dropped >= 2
    assert all(worker.proc.poll() is None for worker in workers), "a worker died of the outage"
    assert (figures.lost, figures.wrong_final) == (0, 0)
    # The workers held their outcomes until the database was back, so nothing ran twice.
    # Before: 185-232 of 600 runs, told to Redis unrecorded and run again by the stale-run repair;
    # then, about one run in seven outages: a one-thread worker's next claim, its lease not
    # renewed while the previous success's write waited (test_outcomes.py: leases).
    assert figures.duplicated == 0
    # Said by each worker's upkeep at its next round once the database answers: the writers may
    # have written every held success, and so ended every run, a moment before.
    wait_until(
        lambda: all("is back after" in worker.output() for worker in workers),
        10,
        "each worker to see the database back",
    )
    # One line when the outage starts and one when it ends, not a traceback per upkeep task and
    # interval (the --threads worker's main thread kept running its upkeep meanwhile).
    assert not any("failed; it runs again at its next interval" in worker.output() for worker in workers)
    # The --threads worker ran no more than it held ready: a success the writer cannot write
    # keeps its job out, so the claimer claims nothing for that thread, instead of the job
    # threads running the lane's backlog (all of it to run again had the process died before
    # the database came back).
    assert started_meanwhile <= 4 * (1 + PREFETCH_PER_THREAD), started_meanwhile


CRASHING_DISPATCH = """
from django.db import transaction
from kumiko_jobs import dispatch
with transaction.atomic():
    for i in range({count}):
        dispatch("tests.chaos_work", {{"i": i, "ms": 1}})
print("committed", flush=True)
"""


def test_processes_killed_between_commit_and_push_lose_nothing(
    chaos_workers: Any, ledger: Ledger, worker_env: dict[str, str], record_property: RecordProperty
) -> None:
    chaos_workers()
    killed = 0
    for _ in range(4):  # 4 processes x 250 runs, each killed right after its COMMIT
        done = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", CRASHING_DISPATCH.format(count=250)],
            cwd=REPO_ROOT, env={**worker_env, "KUMIKO_CRASH_AT": "dispatch:after_commit"},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        killed += done.returncode == -signal.SIGKILL
    run_ids = [
        str(pk) for pk in JobRun.objects.filter(job_name="tests.chaos_work").values_list("pk", flat=True)
    ]
    figures = figures_of("SIGKILL between COMMIT and push (4 x 250)", run_ids, ledger, 90)
    figures.extra.update(processes_killed=killed)
    figures.report(record_property)
    assert killed == 4 and len(run_ids) == 1000
    assert (figures.lost, figures.wrong_final) == (0, 0)


def test_reaper_killed_after_its_record_write_loses_nothing(
    chaos_workers: Any, record_property: RecordProperty
) -> None:
    result = dispatch("tests.hang_first", {"seconds": 60})
    holder = chaos_workers()
    wait_until(
        lambda: JobRun.objects.filter(pk=result.run_id, status=RunStatus.RUNNING).exists(), 15, "start"
    )
    holder.kill_group()
    reaper = chaos_workers(env={"KUMIKO_CRASH_AT": "reap:after_record"}, wait=False)
    code = reaper.wait(timeout=30)
    survivor = chaos_workers()
    run = wait_until(
        lambda: JobRun.objects.filter(pk=result.run_id, status=RunStatus.SUCCEEDED).first(), 30, "retry"
    )
    print_figures = {"reaper_exit": code, "attempt": run.attempt}
    record_property("chaos", f"reaper killed mid-recovery {print_figures}")
    assert code == -signal.SIGKILL
    assert run.attempt == 2 and survivor.proc.poll() is None


def test_poison_jobs_and_wrong_typed_keys_do_not_stop_the_workers(
    chaos_workers: Any,
    ledger: Ledger,
    redis_client: Any,
    tenants: list[Any],
    record_property: RecordProperty,
) -> None:
    keys = get_keys()
    bad_meta = f"{keys.id_tag}-bad-meta"
    redis_client.hset(
        keys.job(bad_meta),
        mapping={
            "data": b"x",
            "meta": '{"run": "not-a-uuid", "job": "x", "lane": "worker"}',
            "kumiko_flow": "t|",
        },
    )
    redis_client.rpush(keys.flow("worker", "t|"), bad_meta)
    redis_client.lpush(keys.ring("worker"), "t|")
    redis_client.hset(keys.flow_states("worker"), "t|", "r")
    # A flow key someone overwrote with a string, holding the ring's attention.
    broken_flow = f"t|{tenants[2].pk}"
    redis_client.set(keys.flow("worker", broken_flow), "not a list")
    redis_client.lpush(keys.ring("worker"), broken_flow)
    redis_client.hset(keys.flow_states("worker"), broken_flow, "r")
    workers = [chaos_workers() for _ in range(2)]
    run_ids = [str(dispatch("tests.chaos_work", {"i": i}, tenant=tenants[i % 2]).run_id) for i in range(50)]
    figures = figures_of("poison jobs and wrong-typed keys", run_ids, ledger, 60)
    figures.extra.update(
        broken_flows=sorted(m.decode() for m in redis_client.smembers(keys.broken_flows("worker"))),
        poison_failed=redis_client.zscore(keys.failed("worker"), bad_meta) is not None,
    )
    figures.report(record_property)
    assert all(worker.proc.poll() is None for worker in workers)
    assert (figures.lost, figures.wrong_final) == (0, 0)
    assert figures.extra["broken_flows"] == [broken_flow] and figures.extra["poison_failed"]
