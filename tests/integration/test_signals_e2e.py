"""Signals from a real runjobs worker: a short run's start is announced with its outcome, a
long run's by the running marker; each exactly once and in order."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from kumiko_jobs import dispatch
from kumiko_jobs.models import JobRun
from tests.integration.conftest import StartWorker
from tests.integration.support import wait_until
from tests.testapp.signals import signals_key

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_short_and_long_runs_announce_their_start_once_before_their_outcome(
    start_worker: StartWorker, tenants: list[Any], redis_client: redis.Redis, wait_for_run: Any
) -> None:
    # Dispatched before the worker starts: job_queued is sent by this process after the push,
    # and an idle worker could start (and finish) a short run before it.
    short = dispatch("tests.record", {"n": 1}, tenant=tenants[0])
    long = dispatch("tests.sleeper", {"seconds": 0.6}, tenant=tenants[0])
    worker = start_worker("worker")
    wait_for_run(long.run_id)

    def entries() -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in redis_client.lrange(signals_key(), 0, -1)]

    # job_queued comes from this process, the rest from the worker's.
    wait_until(lambda: len(entries()) >= 6, 10, "six signals")
    by_run: dict[str, list[tuple[str, int]]] = {}
    for e in entries():
        by_run.setdefault(e["run"]["run_id"], []).append((e["signal"], e["pid"]))
    for result in (short, long):
        sent = by_run[str(result.run_id)]
        assert [name for name, _ in sent] == ["job_queued", "job_started", "job_succeeded"]
        assert {pid for name, pid in sent if name != "job_queued"} == {worker.pid}


def test_a_workers_outcome_counts_reach_redis_within_a_second_of_going_idle(
    start_worker: StartWorker, tenants: list[Any], redis_client: redis.Redis, wait_for_run: Any
) -> None:
    from kumiko_jobs import lane_stats
    from kumiko_jobs.connection import get_keys

    start_worker("worker")
    runs = [dispatch("tests.record", {"n": n}, tenant=tenants[n % 2]) for n in range(6)]
    for run in runs:
        wait_for_run(run.run_id)

    def counted() -> int:
        return lane_stats.hourly(redis_client, get_keys(), "worker")[-1].get("succeeded")

    # No further job comes: the idle worker's next claim (at most every second) carries the tally.
    assert wait_until(lambda: counted() == 6, 5, "six succeeded runs counted")
    per_tenant = lane_stats.tenant_outcomes(redis_client, get_keys(), [str(t.pk) for t in tenants[:2]])
    assert [per_tenant[str(t.pk)]["succeeded"] for t in tenants[:2]] == [3, 3]


@pytest.mark.parametrize("threads", ["1", "3"])
def test_a_busy_worker_says_each_success_once_and_its_upkeep_finds_its_connection_free(
    threads: str, start_worker: StartWorker, tenants: list[Any], redis_client: redis.Redis
) -> None:
    # Successes settle after the worker's next lane step (outcomes.py); a busy worker keeps one
    # settling at nearly every step, and its upkeep (the outbox every 2 s reads the records on
    # the same connection) comes due among them. (Workers run with DEBUG off, see conftest.py:
    # DEBUG's query log would keep the writes off libpq's pipeline, and nothing would settle.)
    runs = [dispatch("tests.sleeper", {"seconds": 0.02}, tenant=tenants[n % 2]) for n in range(150)]
    worker = start_worker("worker", "--threads", threads)

    def succeeded() -> list[str]:
        entries = [json.loads(raw) for raw in redis_client.lrange(signals_key(), 0, -1)]
        mine = [e for e in entries if e["signal"] == "job_succeeded" and e["pid"] == worker.pid]
        return [e["run"]["run_id"] for e in mine]

    wait_until(lambda: len(succeeded()) >= len(runs), 30, "every run's job_succeeded")
    assert sorted(succeeded()) == sorted(str(r.run_id) for r in runs)
    assert JobRun.objects.filter(status="succeeded").count() == len(runs)
    output = worker.output()
    assert "failed" not in output and "retrying" not in output, output
