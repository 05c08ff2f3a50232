"""Run records that Redis contradicts are repaired: lost outcome writes take Redis' outcome, and
a run whose job vanished from Redis is pushed again from its record (never failed for it), once
the next round confirms it is still lost (suspects.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from kumiko_jobs import dispatch, records
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.preparing import prepare
from kumiko_jobs.registry import registry
from kumiko_jobs.repair import repair_stale_runs
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def _age(run_id: str | None, status: str) -> None:
    JobRun.objects.filter(pk=run_id).update(status=status, updated_at=timezone.now() - timedelta(hours=1))


def _next_round(redis_client: Any) -> None:
    """A minute later: the lane's repair lock has expired."""
    redis_client.delete(get_keys().repair_lock("worker"))


def test_lost_outcome_is_repaired_and_a_vanished_job_is_pushed_again(
    redis_client: Any, traces: Any, settings: Any, age_suspects: Any
) -> None:
    # Redis can tell what became of a job only while it keeps finished ones (RESULT_TTL > 0);
    # with the default 0 a lost outcome write means the run is pushed again (at least once).
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "RESULT_TTL": 600}
    done = dispatch("tests.record", {"n": 1})
    gone = dispatch("tests.record", {"n": 2})
    waiting = dispatch("tests.record", {"n": 3}, delay=3600)
    drain()
    # A crash lost the outcome write of `done`; `gone` vanished from Redis while "running" (its
    # worker is gone too).
    _age(done.run_id, RunStatus.RUNNING)
    _age(gone.run_id, RunStatus.RUNNING)
    redis_client.delete(get_keys().job(gone.job_id))
    _age(waiting.run_id, RunStatus.QUEUED)
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 1
    assert JobRun.objects.get(pk=done.run_id).status == RunStatus.SUCCEEDED
    assert JobRun.objects.get(pk=waiting.run_id).status == RunStatus.QUEUED  # Redis agrees
    # `gone` is a suspect: pushed again once a later round finds its row unchanged.
    assert not redis_client.exists(get_keys().job(gone.job_id))
    _next_round(redis_client)
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 0  # too early to tell
    assert age_suspects() == 1
    _next_round(redis_client)
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 1
    assert JobRun.objects.get(pk=gone.run_id).status == RunStatus.QUEUED
    assert drain() == {"succeeded": 1}
    assert JobRun.objects.get(pk=gone.run_id).status == RunStatus.SUCCEEDED
    assert [e["payload"]["n"] for e in traces("record")] == [1, 2, 2]  # at least once
    # One repairer per minute and lane.
    _age(done.run_id, RunStatus.RUNNING)
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 0


def test_a_run_that_finishes_while_repair_looks_is_not_run_again(
    redis_client: Any, traces: Any, age_suspects: Any
) -> None:
    # The oldest run of a backlog is the next one a worker takes. Repair reads its row (queued,
    # stale), then the worker runs it: its success deletes the job hash from Redis while the
    # row's UPDATE is still on its way, so repair's question to Redis finds nothing.
    result = dispatch("tests.record", {"n": 1})
    assert drain() == {"succeeded": 1}
    finished = JobRun.objects.get(pk=result.run_id)
    _age(result.run_id, RunStatus.QUEUED)  # the row as repair read it
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 0
    assert not redis_client.exists(get_keys().job(result.job_id))  # not pushed again
    # The success's write lands.
    JobRun.objects.filter(pk=result.run_id).update(status=finished.status, updated_at=timezone.now())
    assert age_suspects() == 1
    _next_round(redis_client)
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 0
    assert age_suspects() == 0  # confirmed not lost, forgotten
    assert drain() == {}
    assert [e["payload"]["n"] for e in traces("record")] == [1]
    assert JobRun.objects.get(pk=result.run_id).status == RunStatus.SUCCEEDED


def test_recent_unfinished_rows_are_left_alone(redis_client: Any) -> None:
    result = dispatch("tests.record", {})
    drain()
    JobRun.objects.filter(pk=result.run_id).update(status=RunStatus.RUNNING)  # updated just now
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 0
    assert JobRun.objects.get(pk=result.run_id).status == RunStatus.RUNNING


def test_job_deleted_behind_kumikos_back_is_pushed_again_without_counting_its_limit_twice(
    redis_client: Any, tenants: list[Any], age_suspects: Any
) -> None:
    tenant = str(tenants[0].pk)
    runs = [dispatch("tests.limited", {}, tenant=tenant) for _ in range(3)]
    assert dispatch("tests.limited", {}, tenant=tenant).status == "skipped"
    redis_client.delete(get_keys().job(runs[0].job_id))  # a raw DEL (the dashboard cancels instead)
    _age(runs[0].run_id, RunStatus.QUEUED)
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 0
    assert age_suspects() == 1
    _next_round(redis_client)
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 1
    assert dispatch("tests.limited", {}, tenant=tenant).status == "skipped"  # still 3 counted
    assert drain() == {"succeeded": 3}
    assert dispatch("tests.limited", {}, tenant=tenant).status == "queued"  # all given back


def test_a_run_recorded_by_a_dispatcher_that_died_before_its_push_is_pushed_and_runs_once(
    redis_client: Any, traces: Any, age_suspects: Any
) -> None:
    # On PostgreSQL dispatch() sends the row's INSERT before the push: a process killed between
    # them leaves a committed queued row that Redis never saw (dispatching.py).
    prepared = prepare(registry.get("tests.record"), {"n": 7}, tenant_id=None, user_id=None)
    records.insert_queued([prepared.row])
    assert not redis_client.exists(get_keys().job(prepared.job_id))
    assert drain() == {}  # nothing to run: the push never happened
    _age(str(prepared.row.id), RunStatus.QUEUED)
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 0
    assert age_suspects() == 1
    _next_round(redis_client)
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 1
    assert drain() == {"succeeded": 1}
    assert JobRun.objects.get(pk=prepared.row.id).status == RunStatus.SUCCEEDED
    assert [e["payload"]["n"] for e in traces("record")] == [7]


def test_finished_runs_and_other_prefixes_are_never_touched(redis_client: Any, settings: Any) -> None:
    done = dispatch("tests.record", {})
    drain()
    redis_client.delete(get_keys().job(done.job_id))  # RESULT_TTL expired
    JobRun.objects.filter(pk=done.run_id).update(updated_at=timezone.now() - timedelta(hours=1))
    other = dispatch("tests.record", {}, delay=3600)
    _age(other.run_id, RunStatus.QUEUED)
    redis_client.delete(get_keys().job(other.job_id))
    # Another deployment (prefix) on the same database must not repair this one's runs.
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "QUEUE_PREFIX": "another-deployment"}
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 0
    assert JobRun.objects.get(pk=other.run_id).status == RunStatus.QUEUED
    assert JobRun.objects.get(pk=done.run_id).status == RunStatus.SUCCEEDED
