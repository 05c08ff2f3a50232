"""Retrying failed runs by hand: a new run linked to the original; a wrapper's retry reaches
only the tenants its original did not."""

from __future__ import annotations

from typing import Any

import pytest

from kumiko_jobs import dispatch
from kumiko_jobs.exceptions import NotRetryable
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.retrying import retry_failed
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def test_retry_is_a_new_run_pointing_at_the_failed_one(tenants: list[Any]) -> None:
    failed = JobRun.objects.get(pk=dispatch("tests.unrecoverable", {"x": 1}, tenant=tenants[0]).run_id)
    drain()
    failed.refresh_from_db()
    result = retry_failed(failed)
    retry = JobRun.objects.get(pk=result.run_id)
    assert (retry.retry_of, retry.trigger_name, retry.payload) == (failed.pk, "retry", {"x": 1})
    assert (retry.tenant_id, retry.correlation_id) == (failed.tenant_id, failed.correlation_id)


def test_a_run_is_retried_once(tenants: list[Any], traces: Any) -> None:
    """A double click, a second operator, the same filter a day later: the original stays
    failed, and each retry ran the job once more (an invoice charged twice)."""
    failed = JobRun.objects.get(pk=dispatch("tests.unrecoverable", {"x": 1}, tenant=tenants[0]).run_id)
    drain()
    failed.refresh_from_db()
    first = retry_failed(failed)
    with pytest.raises(NotRetryable, match=f"retried already, by run {first.run_id}"):
        retry_failed(failed)
    assert JobRun.objects.filter(retry_of=failed.pk).count() == 1
    assert drain() == {"failed": 1}  # the one retry ran
    assert len(traces("unrecoverable")) == 2


def test_only_failed_runs_are_retried(tenants: list[Any]) -> None:
    run = JobRun.objects.get(pk=dispatch("tests.record", {}, tenant=tenants[0]).run_id)
    with pytest.raises(NotRetryable, match="is queued; only failed runs"):
        retry_failed(run)


def test_retried_wrapper_enqueues_only_the_tenants_the_original_missed(
    settings: Any, tenants: list[Any], traces: Any, monkeypatch: Any
) -> None:
    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "ACTIVE_TENANTS": "tests.testapp.tenants.fails_midway_once",
    }
    monkeypatch.setattr("kumiko_jobs.fanout.BATCH", 1)  # the first tenant is enqueued before the failure
    monkeypatch.setattr("kumiko_jobs.fanout.WRAPPER_ATTEMPTS", 1)  # fails for good: retried by hand
    wrapper = dispatch("tests.per_tenant", {})
    assert drain() == {"failed": 1, "succeeded": 1}
    original = JobRun.objects.get(pk=wrapper.run_id)
    assert original.status == RunStatus.FAILED
    retry_failed(original)
    drain()
    assert sorted(e["tenant"] for e in traces("per_tenant")) == sorted(str(t.pk) for t in tenants)
    assert JobRun.objects.filter(job_name="tests.per_tenant").count() == len(tenants)


def test_an_original_that_was_retried_is_not_requeued(tenants: list[Any], traces: Any) -> None:
    """django-rq's "Requeue" (or "Requeue all") of an original that already runs again as its
    retry ran the job twice."""
    from kumiko_jobs.requeueing import requeue_jobs

    failed = JobRun.objects.get(pk=dispatch("tests.unrecoverable", {"x": 1}, tenant=tenants[0]).run_id)
    drain()
    failed.refresh_from_db()
    retry = retry_failed(failed)
    result = requeue_jobs([failed.job_id])
    assert result.requeued == ()
    assert result.refused == {failed.job_id: f"it was retried already, by run {retry.run_id}"}
    assert drain() == {"failed": 1}  # only the retry ran


def test_a_wrapper_whose_first_run_retention_may_have_pruned_is_not_retried(
    settings: Any, tenants: list[Any], monkeypatch: Any
) -> None:
    """A wrapper's retry skips the tenants reached by the children of its chain's first run,
    found by their rows: once retention may have deleted them, those tenants would run twice."""
    from datetime import timedelta

    from django.utils import timezone

    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "ACTIVE_TENANTS": "tests.testapp.tenants.fails_midway_once",
    }
    monkeypatch.setattr("kumiko_jobs.fanout.BATCH", 1)
    monkeypatch.setattr("kumiko_jobs.fanout.WRAPPER_ATTEMPTS", 1)
    wrapper = dispatch("tests.per_tenant", {})
    assert drain() == {"failed": 1, "succeeded": 1}
    original = JobRun.objects.get(pk=wrapper.run_id)
    retention = int(settings.KUMIKO_JOBS.get("RUN_RETENTION", 30 * 86400))
    JobRun.objects.filter(pk=original.pk).update(queued_at=timezone.now() - timedelta(seconds=retention + 60))
    original.refresh_from_db()
    with pytest.raises(NotRetryable, match=r"RUN_RETENTION.*Dispatch the job anew"):
        retry_failed(original)
    assert not JobRun.objects.filter(retry_of=original.pk).exists()

    # A retry of a retry whose first run is gone altogether: refused the same way.
    JobRun.objects.filter(pk=original.pk).update(queued_at=timezone.now())
    original.refresh_from_db()
    first_retry = JobRun.objects.get(pk=retry_failed(original).run_id)
    JobRun.objects.filter(pk=first_retry.pk).update(status=RunStatus.FAILED, finished_at=timezone.now())
    first_retry.refresh_from_db()
    JobRun.objects.filter(pk=original.pk).delete()  # pruned
    with pytest.raises(NotRetryable, match="pruned already"):
        retry_failed(first_retry)
