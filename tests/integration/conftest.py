"""Fixtures of the end-to-end tests: real ``manage.py runjobs --lane X`` subprocesses.

A worker subprocess shares the test's Redis prefix (KUMIKO_QUEUE_PREFIX) and the test database
(DATABASE_URL), so tests dispatch in-process and assert on traces and JobRun rows the worker
wrote. Tests must be ``django_db(transaction=True)``: the worker sees committed rows only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from kumiko_jobs.conf import redis_url
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import FINISHED_STATUSES, JobRun
from tests.integration.support import WorkerProcess, database_url, in_started_registry, wait_until

StartWorker = Callable[..., WorkerProcess]


@pytest.fixture
def runjobs_env(kumiko_prefix: str) -> dict[str, str]:
    """Environment of a runjobs subprocess that needs no database (argument and Redis errors).
    DEBUG off, as in production: DEBUG's query log would take the workers' run writes off
    libpq's pipeline (pg_pipeline.available), and the tests would not run the path users get."""
    return {
        **os.environ,
        "DJANGO_DEBUG": "0",
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "KUMIKO_QUEUE_PREFIX": kumiko_prefix,
        "KUMIKO_REDIS_URL": redis_url(),
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def worker_env(runjobs_env: dict[str, str], transactional_db: None) -> dict[str, str]:
    """Environment of a runjobs subprocess working on this test's database and Redis prefix."""
    from django.db import connection

    return {**runjobs_env, "DATABASE_URL": database_url(connection.settings_dict)}


@pytest.fixture
def start_worker(
    worker_env: dict[str, str], kumiko_prefix: str, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[StartWorker]:
    """``start_worker(lane, *args, env={...}, wait=True)`` starts a runjobs subprocess.

    With ``wait`` it returns once the worker has joined its lane. Every worker is stopped at
    teardown (SIGTERM, SIGKILL after 10 s); its output is printed (shown if the test failed).
    """
    started: list[WorkerProcess] = []

    def start(
        lane: str = "worker", *args: str, env: dict[str, str] | None = None, wait: bool = True
    ) -> WorkerProcess:
        name = f"{kumiko_prefix}-{lane}-{len(started) + 1}"
        log_path = tmp_path / f"{name}.log"
        worker = WorkerProcess(
            ["--lane", lane, "--name", name, *args], {**worker_env, **(env or {})}, log_path
        )
        started.append(worker)
        if wait:
            worker.wait_registered(redis_client, get_keys().claimers(lane), name)
        return worker

    yield start
    for worker in started:
        code = worker.stop()
        print(f"----- runjobs {' '.join(worker.args)} (pid {worker.pid}, exit {code}) -----")
        print(worker.output())
    # A killed worker never unregisters from RQ's global worker set: kumiko_prefix's teardown
    # (after this one) takes the prefix's workers and queues out of RQ's global sets.


@pytest.fixture
def wait_for_run(redis_client: redis.Redis) -> Callable[..., JobRun]:
    """``wait_for_run(run_id, statuses=("succeeded", "failed"), timeout=10)`` -> the JobRun.

    For final statuses it also waits until Redis has heard of the outcome: a worker writes the
    record first (outcomes.py), then its lane step takes the job out of the started registry
    and, in the same script, files it as failed, frees its cap slots and so on. So a test that
    reads Redis after ``wait_for_run`` sees the settled job, not a moment before it."""

    def wait(
        run_id: str, statuses: tuple[str, ...] = ("succeeded", "failed"), timeout: float = 10.0
    ) -> JobRun:
        def reached() -> JobRun | None:
            return JobRun.objects.filter(pk=run_id, status__in=statuses).first()

        found: JobRun = wait_until(reached, timeout, f"run {run_id} to reach {statuses}", step=0.05)
        if set(statuses) <= set(FINISHED_STATUSES):
            wait_until(
                lambda: not in_started_registry(redis_client, found),
                timeout,
                f"Redis to hear how run {run_id} ended",
            )
        return found

    return wait


@pytest.fixture
def wait_for_traces(traces: Any) -> Callable[..., list[dict[str, Any]]]:
    """``wait_for_traces(kind, count=1, timeout=10)`` -> the traces of that kind, once there are enough."""

    def wait(kind: str, count: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
        def enough() -> list[dict[str, Any]] | None:
            entries: list[dict[str, Any]] = traces(kind)
            return entries if len(entries) >= count else None

        found: list[dict[str, Any]] = wait_until(enough, timeout, f"{count} {kind!r} trace(s)")
        return found

    return wait
