"""Run records that Redis contradicts are repaired (lost outcome writes, vanished jobs)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.repair import repair_stale_runs
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def _age(run_id: str | None, status: str) -> None:
    JobRun.objects.filter(pk=run_id).update(status=status, updated_at=timezone.now() - timedelta(hours=1))


def test_lost_outcome_and_vanished_job_are_repaired(redis_client: Any) -> None:
    done = dispatch("tests.record", {"n": 1})
    gone = dispatch("tests.record", {"n": 2})
    waiting = dispatch("tests.record", {"n": 3}, delay=3600)
    drain()
    # A crash lost the outcome write of `done`; `gone` vanished from Redis while "running".
    _age(done.run_id, RunStatus.RUNNING)
    _age(gone.run_id, RunStatus.RUNNING)
    redis_client.delete(get_keys().job(gone.job_id))
    _age(waiting.run_id, RunStatus.QUEUED)
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 2
    assert JobRun.objects.get(pk=done.run_id).status == RunStatus.SUCCEEDED
    lost = JobRun.objects.get(pk=gone.run_id)
    assert lost.status == RunStatus.FAILED and "gone from Redis" in lost.error
    assert JobRun.objects.get(pk=waiting.run_id).status == RunStatus.QUEUED  # Redis agrees
    # One repairer per minute and lane.
    _age(done.run_id, RunStatus.RUNNING)
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 0


def test_recent_unfinished_rows_are_left_alone(redis_client: Any) -> None:
    result = dispatch("tests.record", {})
    drain()
    JobRun.objects.filter(pk=result.run_id).update(status=RunStatus.RUNNING)  # updated just now
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 0
    assert JobRun.objects.get(pk=result.run_id).status == RunStatus.RUNNING


def test_job_deleted_from_redis_gives_back_its_skip_limit(redis_client: Any, tenants: list[Any]) -> None:
    tenant = str(tenants[0].pk)
    runs = [dispatch("tests.limited", {}, tenant=tenant) for _ in range(3)]
    assert dispatch("tests.limited", {}, tenant=tenant).status == "skipped"
    redis_client.delete(get_keys().job(runs[0].job_id))  # e.g. "delete" in RQ's dashboard
    _age(runs[0].run_id, RunStatus.QUEUED)
    assert repair_stale_runs(redis_client, get_keys(), "worker") == 1
    assert dispatch("tests.limited", {}, tenant=tenant).status == "queued"
