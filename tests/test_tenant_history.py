"""Tenant-visible history: subjects at dispatch, failure records, and the tenant querysets."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from django.db import connections

from kumiko_jobs import InvalidPayload, InvalidTenant, dispatch, tenant_failures, tenant_runs
from kumiko_jobs.connection import get_keys
from kumiko_jobs.failure_records import record_tenant_failure
from kumiko_jobs.models import JobRun, RunStatus, TenantFailure
from kumiko_jobs.tenant_history import TENANT_FAILURE_FIELDS, TENANT_RUN_FIELDS, canonical_subject
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)

EXPORT = "tests.export_invoice"


def run_of(result: Any) -> JobRun:
    return JobRun.objects.get(pk=result.run_id)


def test_subject_is_canonical_json_sorted_by_field_with_missing_fields_as_null(tenants: list[Any]) -> None:
    run = run_of(dispatch(EXPORT, {"invoice_id": 42, "other": "x"}, tenant=tenants[0]))
    assert run.subject == '[["format",null],["invoice_id",42]]'
    assert run.tenant_visible is True
    assert canonical_subject({"b": "é", "a": True}) == '[["a",true],["b","é"]]'


def test_jobs_without_subject_fields_store_no_subject(tenants: list[Any]) -> None:
    assert run_of(dispatch("tests.failure_only", {"fail": False}, tenant=tenants[0])).subject is None
    plain = run_of(dispatch("tests.record", {"n": 1}, tenant=tenants[0]))
    assert (plain.subject, plain.tenant_visible) == (None, False)


@pytest.mark.parametrize("value", [[1, 2], {"a": 1}])
def test_a_non_primitive_subject_field_is_refused_before_anything_is_written(
    tenants: list[Any], redis_client: redis.Redis, value: Any
) -> None:
    with pytest.raises(InvalidPayload, match=r"\$\.invoice_id.*subject field 'invoice_id'.*str, int, float"):
        dispatch(EXPORT, {"invoice_id": value}, tenant=tenants[0])
    assert not JobRun.objects.exists()
    assert not list(redis_client.scan_iter(match=f"*{get_keys().prefix}*"))


def test_a_subject_too_long_for_its_column_is_refused(tenants: list[Any]) -> None:
    with pytest.raises(InvalidPayload, match="at most 500 fit"):
        dispatch(EXPORT, {"invoice_id": "x" * 600}, tenant=tenants[0])
    assert not JobRun.objects.exists()


def test_system_runs_are_never_tenant_visible(tenants: list[Any]) -> None:
    run = run_of(dispatch(EXPORT, {"invoice_id": 1, "fail": "always"}))
    drain()
    run.refresh_from_db()
    assert (run.status, run.tenant_visible) == (RunStatus.FAILED, False)
    assert not TenantFailure.objects.exists()


def test_tenant_runs_lists_only_that_tenants_visible_runs_with_safe_fields(tenants: list[Any]) -> None:
    acme, globex, _ = tenants
    mine = dispatch(EXPORT, {"invoice_id": 1}, tenant=acme)
    dispatch(EXPORT, {"invoice_id": 2}, tenant=globex)
    dispatch("tests.record", {"n": 1}, tenant=acme)  # not declared tenant-visible
    dispatch(EXPORT, {"invoice_id": 3})  # system run
    rows = list(tenant_runs(acme))
    assert [row["id"] for row in rows] == [uuid.UUID(mine.run_id)]
    assert set(rows[0]) == set(TENANT_RUN_FIELDS)
    assert not {"payload", "error", "traceback", "logs"} & set(rows[0])
    assert list(tenant_runs(acme.pk)) == rows  # an id works as well as an instance
    # The keys read as attributes too, as a model's fields would; the hidden ones are not there.
    assert (rows[0].id, rows[0].status) == (rows[0]["id"], "queued")
    with pytest.raises(AttributeError, match="no 'payload'; it holds only id, job_name"):
        rows[0].payload  # noqa: B018
    narrowed = tenant_runs(acme).filter(status="queued").order_by("queued_at")[:5]
    assert [row.id for row in narrowed] == [uuid.UUID(mine.run_id)]


def test_tenant_runs_filters_by_job_and_subject(tenants: list[Any]) -> None:
    acme = tenants[0]
    one = dispatch(EXPORT, {"invoice_id": 1}, tenant=acme)
    dispatch(EXPORT, {"invoice_id": 2}, tenant=acme)
    dispatch("tests.replaceable", {}, tenant=acme)

    def ids(**filters: Any) -> set[str]:
        return {str(row["id"]) for row in tenant_runs(acme, **filters)}

    assert len(ids(job=EXPORT)) == 2
    assert ids(job=EXPORT, subject={"invoice_id": 1}) == {one.run_id}
    assert ids(subject='[["format",null],["invoice_id",1]]') == {one.run_id}
    # Any JSON spelling of the same pairs (json.dumps' spaces, another order) finds it too.
    assert ids(subject=json.dumps([["invoice_id", 1], ["format", None]])) == {one.run_id}
    assert ids(subject="not json") == set()
    with pytest.raises(ValueError, match="subject fields"):
        ids(job=EXPORT, subject={"customer": 1})


def test_tenant_runs_show_states_and_times(tenants: list[Any]) -> None:
    acme = tenants[0]
    dispatch(EXPORT, {"invoice_id": 1}, tenant=acme)
    (queued,) = tenant_runs(acme)
    assert (queued["status"], queued["started_at"], queued["finished_at"]) == ("queued", None, None)
    drain()
    (done,) = tenant_runs(acme)
    assert done["status"] == "succeeded"
    assert done["queued_at"] <= done["started_at"] <= done["finished_at"]


def test_replaced_runs_leave_the_tenants_list(tenants: list[Any]) -> None:
    acme = tenants[0]
    first = dispatch("tests.replaceable", {"n": 1}, tenant=acme)
    second = dispatch("tests.replaceable", {"n": 2}, tenant=acme)
    assert run_of(first).status == RunStatus.DROPPED
    assert [str(row["id"]) for row in tenant_runs(acme)] == [second.run_id]


def test_tenant_querysets_need_a_tenant() -> None:
    with pytest.raises(InvalidTenant, match="need a tenant"):
        tenant_runs(None)
    with pytest.raises(InvalidTenant, match="need a tenant"):
        tenant_failures(None)


def test_a_final_failure_records_the_declared_key_never_the_error_text(tenants: list[Any]) -> None:
    acme = tenants[0]
    run = run_of(dispatch(EXPORT, {"invoice_id": 7, "fail": "always"}, tenant=acme))
    assert drain() == {"retried": 1, "failed": 1}
    # Two attempts, one record: only the final failure writes it.
    (failure,) = tenant_failures(acme)
    assert set(failure) == set(TENANT_FAILURE_FIELDS)
    assert failure["message_key"] == "billing.export_failed"
    assert failure["subject"] == '[["format",null],["invoice_id",7]]'
    assert failure["count"] == 1
    assert (failure.message_key, failure.count) == ("billing.export_failed", 1)  # as attributes too
    assert "secret provider text" not in str(failure)
    row = TenantFailure.objects.get()
    assert (row.tenant_id, row.job_name, row.last_run_id) == (str(acme.pk), EXPORT, run.pk)
    run.refresh_from_db()
    assert "secret provider text" in run.error  # operators still see it on the run


def test_the_errors_own_message_key_wins(tenants: list[Any]) -> None:
    dispatch(EXPORT, {"invoice_id": 8, "fail": "partner"}, tenant=tenants[0])
    drain()
    assert [f["message_key"] for f in tenant_failures(tenants[0])] == ["billing.partner_down"]


def test_an_unrecoverable_error_with_retries_left_records_at_once(tenants: list[Any]) -> None:
    dispatch(EXPORT, {"invoice_id": 9, "fail": "unrecoverable"}, tenant=tenants[0])
    assert drain() == {"failed": 1}
    assert tenant_failures(tenants[0]).count() == 1


def test_a_retried_attempt_that_succeeds_records_nothing(tenants: list[Any]) -> None:
    dispatch(EXPORT, {"invoice_id": 10, "fail": "attempt1"}, tenant=tenants[0])
    assert drain() == {"retried": 1, "succeeded": 1}
    assert not TenantFailure.objects.exists()


def test_repeated_failures_count_on_one_record_and_a_later_success_clears_it(
    tenants: list[Any], redis_client: redis.Redis
) -> None:
    acme, globex, _ = tenants
    for tenant in (acme, acme, globex):
        dispatch(EXPORT, {"invoice_id": 11, "fail": "switch"}, tenant=tenant)
    dispatch(EXPORT, {"invoice_id": 12, "fail": "switch"}, tenant=acme)
    drain()
    counts = {(f.tenant_id, f.subject): f.count for f in TenantFailure.objects.all()}
    subject = '[["format",null],["invoice_id",11]]'
    assert counts[(str(acme.pk), subject)] == 2
    assert counts[(str(globex.pk), subject)] == 1
    first = TenantFailure.objects.get(tenant_id=acme.pk, subject=subject)
    assert first.first_failed_at < first.last_failed_at
    redis_client.set(f"{get_keys().prefix}:switch", "1")
    dispatch(EXPORT, {"invoice_id": 11, "fail": "switch"}, tenant=acme)
    drain()
    # Only acme's record of invoice 11 is cleared: other subjects and tenants keep theirs.
    remaining = {(f["subject"], f["count"]) for f in tenant_failures(acme)}
    assert remaining == {('[["format",null],["invoice_id",12]]', 1)}
    assert tenant_failures(globex).count() == 1


def test_failures_without_a_subject_are_one_record_per_tenant_and_job(tenants: list[Any]) -> None:
    for _ in range(3):
        dispatch("tests.failure_only", {"fail": True}, tenant=tenants[0])
    drain()
    (failure,) = TenantFailure.objects.all()
    assert (failure.subject, failure.count, failure.message_key) == (None, 3, "sync.failed")
    # The job's runs are not tenant-visible (it declares failures only).
    assert not tenant_runs(tenants[0]).exists()
    dispatch("tests.failure_only", {"fail": False}, tenant=tenants[0])
    drain()
    assert not TenantFailure.objects.exists()


@pytest.mark.parametrize("subject", [None, '[["invoice_id",1]]'])
def test_concurrent_final_failures_meet_in_one_row(tenants: list[Any], subject: str | None) -> None:
    """The upsert is race-safe: parallel writers (own connections) leave one row, all counted."""
    writers, barrier = 6, threading.Barrier(6)
    errors: list[BaseException] = []

    def fail_once() -> None:
        try:
            barrier.wait()
            record_tenant_failure(
                tenant_id=str(tenants[0].pk), job_name=EXPORT, subject=subject, message_key="k",
                run_id=str(uuid.uuid4()), now=datetime.now(UTC),
            )  # fmt: skip
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=fail_once) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    (row,) = TenantFailure.objects.all()
    assert (row.subject, row.count) == (subject, writers)


def test_runs_queued_at_the_same_moment_keep_one_order(tenants: list[Any]) -> None:
    """Pages are LIMIT/OFFSET slices: with equal times and no tie-breaker a row could repeat on
    one page and be missing from the next."""
    acme = tenants[0]
    runs = [dispatch(EXPORT, {"invoice_id": i}, tenant=acme) for i in range(5)]
    JobRun.objects.filter(pk__in=[r.run_id for r in runs]).update(queued_at=datetime(2026, 1, 1, tzinfo=UTC))
    pages = [row["id"] for start in range(0, 5, 2) for row in tenant_runs(acme)[start : start + 2]]
    assert pages == sorted((uuid.UUID(r.run_id) for r in runs), reverse=True)
