"""Retention: finished runs, tenant failures and audits older than their settings are deleted in
batches; unfinished runs never, however old."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from kumiko_jobs import dispatch
from kumiko_jobs.models import FINISHED_STATUSES, EscapeHatchAudit, JobRun, RunStatus, TenantFailure
from kumiko_jobs.registry import registry
from kumiko_jobs.retention import prune
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)

DAY = timedelta(days=1)


def make_runs(tenant: Any, count: int, status: str, age: timedelta) -> list[JobRun]:
    """Rows as old as ``age`` (dispatch and drain, then moved back in time)."""
    now = datetime.now(UTC)
    ids = [dispatch("tests.record", {"n": i}, tenant=tenant).run_id for i in range(count)]
    if status != RunStatus.QUEUED:
        drain()
    rows = JobRun.objects.filter(pk__in=ids)
    finished = now - age if status in FINISHED_STATUSES else None
    rows.update(status=status, queued_at=now - age - timedelta(minutes=1), finished_at=finished)
    return list(rows)


def audit(age: timedelta) -> EscapeHatchAudit:
    seen = datetime.now(UTC) - age
    return EscapeHatchAudit.objects.create(
        job_name="tests.hatch", tenant_id="1", kind="unscoped", reason="r", actor="a",
        window_start=seen, first_seen=seen, last_seen=seen,
    )  # fmt: skip


def failure(tenant_id: str, age: timedelta) -> TenantFailure:
    at = datetime.now(UTC) - age
    return TenantFailure.objects.create(
        tenant_id=tenant_id, job_name="tests.export_invoice", subject=f'[["n",{age.days}]]', message_key="k",
        first_failed_at=at, last_failed_at=at,
    )  # fmt: skip


def test_prunes_old_finished_history_and_keeps_the_rest(tenants: list[Any]) -> None:
    acme = tenants[0]
    old_done = make_runs(acme, 3, RunStatus.SUCCEEDED, 31 * DAY)
    old_failed = make_runs(acme, 2, RunStatus.FAILED, 40 * DAY)
    recent = make_runs(acme, 2, RunStatus.SUCCEEDED, 29 * DAY)
    old_queued = make_runs(acme, 1, RunStatus.QUEUED, 60 * DAY)
    old_running = make_runs(acme, 1, RunStatus.RUNNING, 60 * DAY)
    old_deferred = make_runs(acme, 1, RunStatus.DEFERRED, 60 * DAY)
    audits = [audit(91 * DAY), audit(89 * DAY)]
    failures = [failure(str(acme.pk), 31 * DAY), failure(str(acme.pk), 2 * DAY)]

    dry = prune(dry_run=True)
    assert (dry.runs, dry.tenant_failures, dry.audits, dry.dry_run) == (5, 1, 1, True)
    assert JobRun.objects.count() == 10  # a dry run deletes nothing

    report = prune(batch=2)  # several batches
    assert (report.runs, report.tenant_failures, report.audits) == (5, 1, 1)
    kept = set(JobRun.objects.values_list("pk", flat=True))
    assert kept == {run.pk for run in [*recent, *old_queued, *old_running, *old_deferred]}
    assert not kept & {run.pk for run in [*old_done, *old_failed]}
    assert list(EscapeHatchAudit.objects.values_list("pk", flat=True)) == [audits[1].pk]
    assert list(TenantFailure.objects.values_list("pk", flat=True)) == [failures[1].pk]
    assert prune().runs == 0


def test_retention_follows_the_settings(settings: Any, tenants: list[Any]) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "RUN_RETENTION": 2 * 86400, "AUDIT_RETENTION": 3600}
    make_runs(tenants[0], 1, RunStatus.SUCCEEDED, 3 * DAY)
    make_runs(tenants[0], 1, RunStatus.SUCCEEDED, 1 * DAY)
    audit(timedelta(hours=2))
    report = prune()
    assert (report.runs, report.audits) == (1, 1)
    assert report.run_cutoff < datetime.now(UTC) - timedelta(days=2) + timedelta(seconds=5)


def test_each_batch_is_a_bounded_statement(tenants: list[Any]) -> None:
    make_runs(tenants[0], 5, RunStatus.SUCCEEDED, 31 * DAY)
    with CaptureQueriesContext(connection) as captured:
        assert prune(batch=2).runs == 5
    run_queries = [q["sql"] for q in captured.captured_queries if "kumiko_jobs_jobrun" in q["sql"]]
    selects = [sql for sql in run_queries if sql.lstrip().upper().startswith("SELECT")]
    deletes = [sql for sql in run_queries if sql.lstrip().upper().startswith("DELETE")]
    assert len(deletes) == 3  # 2 + 2 + 1
    assert all("LIMIT 2" in sql for sql in selects), selects
    assert all("ORDER BY" in sql and '"queued_at"' in sql for sql in selects)
    # Each page after the first starts its index scan at the last key seen (a plain lower bound
    # beside the (key, pk) OR, which alone bounds no scan: each page re-read all before it).
    assert all('"queued_at" >=' in sql for sql in selects[1:]), selects


def test_a_record_refreshed_between_a_batchs_select_and_its_delete_stays() -> None:
    """The batch's DELETE selects by age again: a failure counted again (or an audit used again)
    after the SELECT picked it is new history."""
    from kumiko_jobs.retention import _deleter

    stale, refreshed = failure("1", 40 * DAY), failure("2", 40 * DAY)
    cutoff = datetime.now(UTC) - 30 * DAY
    delete = _deleter(TenantFailure.objects.filter(last_failed_at__lt=cutoff))
    TenantFailure.objects.filter(pk=refreshed.pk).update(last_failed_at=datetime.now(UTC))
    assert delete([stale.pk, refreshed.pk]) == 1
    assert list(TenantFailure.objects.values_list("pk", flat=True)) == [refreshed.pk]


def test_the_daily_job_is_declared_and_prunes_when_dispatched_by_hand(tenants: list[Any]) -> None:
    definition = registry.get("kumiko_jobs.prune_history")
    assert definition.concurrency == "skip"
    assert [getattr(t, "expr", None) for t in definition.triggers] == ["17 3 * * *"]
    make_runs(tenants[0], 2, RunStatus.SUCCEEDED, 31 * DAY)
    run_id = dispatch("kumiko_jobs.prune_history").run_id
    drain()
    run = JobRun.objects.get(pk=run_id)
    assert run.status == RunStatus.SUCCEEDED
    assert any("pruned 2 runs" in line["msg"] for line in run.logs)
    assert JobRun.objects.count() == 1  # the prune run itself


def test_jobs_prune_command(tenants: list[Any]) -> None:
    make_runs(tenants[0], 2, RunStatus.SUCCEEDED, 31 * DAY)
    out = StringIO()
    call_command("jobs", "prune", "--dry-run", stdout=out)
    assert "would delete" in out.getvalue()
    assert "finished runs" in out.getvalue()
    assert JobRun.objects.count() == 2
    out = StringIO()
    call_command("jobs", "prune", "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert (report["runs"], report["dry_run"]) == (2, False)
    assert not JobRun.objects.exists()


def test_every_keyset_walk_bounds_its_index_scan() -> None:
    """Retention, the rebuild and the stale-run repair page through the run table with
    keyset.after: each later page says where its index scan starts (the (key, pk) OR alone
    does not, and a page re-read every row before it)."""
    from kumiko_jobs import keyset

    page = keyset.after(
        JobRun.objects.all(), "updated_at", datetime.now(UTC), "00000000-0000-0000-0000-000000000000"
    )
    sql = str(page.query)
    assert '"updated_at" >=' in sql and '"updated_at" >' in sql.replace('"updated_at" >=', "")
