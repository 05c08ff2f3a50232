"""The admin: run browser (filters, detail, tenant staff, retry action) and the audit list."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from kumiko_jobs import dispatch
from kumiko_jobs.admin.changelist import CappedCountPaginator, RunQuerySet
from kumiko_jobs.models import EscapeHatchAudit, JobRun, RunStatus
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)

RUNS_URL = "/admin/kumiko_jobs/jobrun/"
AUDITS_URL = "/admin/kumiko_jobs/escapehatchaudit/"


@pytest.fixture
def runs(tenants: list[Any]) -> dict[str, JobRun]:
    """Runs in several states, made through dispatch() and drain()."""
    acme, globex, _ = tenants
    results = {
        "succeeded": dispatch("tests.record", {"n": 1}, tenant=acme),
        "failed": dispatch("tests.flaky", {"succeed_on": 99}, tenant=globex),
        "unrecoverable": dispatch("tests.unrecoverable", {}, tenant=acme),
        "api": dispatch("tests.api_record", {}),
    }
    drain()
    results["queued"] = dispatch("tests.record", {"n": 2}, tenant=globex)
    rows = {run.job_id: run for run in JobRun.objects.all()}
    return {key: rows[str(result.job_id)] for key, result in results.items()}


def listed(response: Any) -> set[str]:
    return {run.job_id for run in response.context["cl"].result_list}


def test_changelist_lists_runs_in_every_state(admin_client: Client, runs: dict[str, JobRun]) -> None:
    response = admin_client.get(RUNS_URL)
    assert response.status_code == 200
    assert listed(response) == {run.job_id for run in runs.values()}
    statuses = {run.status for run in runs.values()}
    assert statuses == {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.QUEUED}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("status=failed", {"failed", "unrecoverable"}),
        ("status=queued", {"queued"}),
        ("job_name=tests.record", {"succeeded", "queued"}),
        ("lane=api", {"api"}),
        ("tenant=ACME", {"succeeded", "unrecoverable"}),
        ("tenant=-", {"api"}),
        ("status=failed&tenant=GLOBEX", {"failed"}),
        ("q=JOB_ID", {"failed"}),
        ("q=RUN_ID", {"failed"}),
        ("q=no-such-job", set()),
        # The spellings Django's own list filters put in URLs.
        ("status__exact=failed&job_name__exact=tests.flaky", {"failed"}),
        ("lane__exact=api", {"api"}),
        ("tenant_id__exact=ACME", {"succeeded", "unrecoverable"}),
        ("tenant_id=GLOBEX", {"failed", "queued"}),
        ("tenant_id__isnull=True", {"api"}),
    ],
)
def test_changelist_filters_and_search(
    admin_client: Client, runs: dict[str, JobRun], tenants: list[Any], query: str, expected: set[str]
) -> None:
    query = (
        query.replace("ACME", str(tenants[0].pk)).replace("GLOBEX", str(tenants[1].pk))
        .replace("JOB_ID", runs["failed"].job_id).replace("RUN_ID", str(runs["failed"].pk))
    )  # fmt: skip
    response = admin_client.get(f"{RUNS_URL}?{query}")
    assert response.status_code == 200
    assert listed(response) == {runs[key].job_id for key in expected}


def test_changelist_html_shows_columns_and_filters(
    admin_client: Client, runs: dict[str, JobRun], tenants: list[Any]
) -> None:
    html = admin_client.get(RUNS_URL).content.decode()
    failed = runs["failed"]
    # Status badges, "attempt/max_attempts", tenant id and name, lane, duration.
    for text in ("Succeeded", "Failed", "Queued", "3/3", "1/4", f"{tenants[1].pk} · Globex", "api", " ms<"):
        assert text in html, text
    assert f'href="/admin/kumiko_jobs/jobrun/{failed.pk}/change/' in html
    for title in ("By status", "By job", "By lane", "By tenant"):
        assert title in html
    assert "?job_name=tests.hatch" in html  # declared jobs are listed before they ever ran
    assert "Retry selected failed runs" in html
    assert "Cancel selected queued runs" in html
    assert "Delete selected" not in html
    assert "5 job runs" in html
    assert 'id="searchbar"' in html
    assert "Exact job id, run id or correlation id." in html
    assert "date-hierarchy" in html or "xfull" in html


def test_changelist_counts_no_whole_table_and_resolves_tenant_names_once(
    admin_client: Client, runs: dict[str, JobRun], tenants: list[Any]
) -> None:
    def page_queries() -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(RUNS_URL).status_code == 200
        return [query["sql"] for query in captured.captured_queries]

    first = page_queries()
    for tenant in tenants:
        dispatch("tests.record", {"n": 3}, tenant=tenant)
    second = page_queries()
    # More rows and tenants on the page, same queries: no per-row lookups.
    assert len(second) == len(first)
    counts = [sql for sql in second if "COUNT(" in sql.upper()]
    assert counts, "the paginator counts"
    assert all(re.search(r"LIMIT \d+", sql) for sql in counts), counts
    # Filter choices come without a DISTINCT scan over the table.
    assert not [sql for sql in second if "DISTINCT" in sql.upper()]
    tenant_queries = [sql for sql in second if '"demo_tenant"' in sql]
    assert len(tenant_queries) == 2, tenant_queries  # the tenant filter's choices and the page's names


def test_count_stops_at_the_cap(admin_client: Client, runs: dict[str, JobRun], monkeypatch: Any) -> None:
    monkeypatch.setattr(CappedCountPaginator, "COUNT_CAP", 3)
    response = admin_client.get(f"{RUNS_URL}?status=failed")
    assert "2 job runs" in response.content.decode()
    response = admin_client.get(RUNS_URL)
    assert response.context["cl"].result_count == 3
    assert "3+ job runs" in response.content.decode()


def test_tenant_column_and_filter_without_tenant_model(
    admin_client: Client, settings: Any, runs: dict[str, JobRun], tenants: list[Any]
) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_MODEL": None}
    response = admin_client.get(RUNS_URL)
    html = response.content.decode()
    assert "Globex" not in html  # neither in the column nor in the filter: ids only
    tenant_filter = next(spec for spec in response.context["cl"].filter_specs if spec.title == "tenant")
    choices = [value for value, _ in tenant_filter.lookup_choices]
    assert choices == [*sorted([str(tenants[0].pk), str(tenants[1].pk)]), "-"]
    response = admin_client.get(f"{RUNS_URL}?tenant={tenants[1].pk}")
    assert listed(response) == {runs["failed"].job_id, runs["queued"].job_id}


def test_detail_shows_logs_error_traceback_and_payload_to_operators(
    admin_client: Client, runs: dict[str, JobRun]
) -> None:
    failed = admin_client.get(f"{RUNS_URL}{runs['failed'].pk}/change/")
    assert failed.status_code == 200
    html = failed.content.decode()
    assert "flaky failure on attempt 3" in html
    assert re.search(r"<pre>Traceback \(most recent call last\):\n.*RuntimeError: flaky failure", html, re.S)
    assert "&quot;succeed_on&quot;: 99" in html  # pretty-printed JSON
    for label in ("Defer count", "Fanout count", "Next attempt at", "Correlation id"):
        assert label in html
    assert 'name="_save"' not in html  # read-only

    succeeded = admin_client.get(f"{RUNS_URL}{runs['succeeded'].pk}/change/").content.decode()
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d info \[1\] recording 1", succeeded)
    assert "Acme Corp" in succeeded


def test_staff_without_tenant_see_nothing(staff_client: Any, runs: dict[str, JobRun]) -> None:
    client = staff_client("staff-nowhere")
    assert client.get(RUNS_URL).status_code == 403
    assert client.get(f"{RUNS_URL}{runs['failed'].pk}/change/").status_code in (302, 403)


def test_runs_cannot_be_added_changed_or_deleted(admin_client: Client, runs: dict[str, JobRun]) -> None:
    run = runs["failed"]
    assert admin_client.get(f"{RUNS_URL}add/").status_code == 403
    assert admin_client.get(f"{RUNS_URL}{run.pk}/delete/").status_code == 403
    assert admin_client.post(f"{RUNS_URL}{run.pk}/change/", {"job_name": "x"}).status_code == 403
    response = admin_client.post(RUNS_URL, {"action": "delete_selected", "_selected_action": [str(run.pk)]})
    assert [str(m) for m in get_messages(response.wsgi_request)] == ["No action selected."]
    assert JobRun.objects.filter(pk=run.pk, job_name="tests.flaky").exists()


def test_retry_action_redispatches_failed_runs_and_skips_others(
    admin_client: Client, runs: dict[str, JobRun], admin_user: Any
) -> None:
    failed, succeeded = runs["failed"], runs["succeeded"]
    response = admin_client.post(
        RUNS_URL, {"action": "retry_failed_runs", "_selected_action": [str(failed.pk), str(succeeded.pk)]}
    )
    assert response.status_code == 302
    texts = [str(message) for message in get_messages(response.wsgi_request)]
    assert texts[0] == "Re-dispatched 1 failed runs."
    assert texts[1] == f"Skipped 1: tests.record {succeeded.pk} (succeeded)."

    retry = JobRun.objects.exclude(pk__in=[run.pk for run in runs.values()]).get()
    assert (retry.job_name, retry.status) == ("tests.flaky", RunStatus.QUEUED)
    assert retry.tenant_id == failed.tenant_id
    assert retry.payload == failed.payload == {"succeed_on": 99}
    assert (retry.triggered_by, retry.correlation_id) == (str(admin_user.pk), failed.correlation_id)
    assert (retry.trigger_name, retry.retry_of) == ("retry", failed.pk)
    assert JobRun.objects.filter(job_name="tests.record").count() == 2  # nothing new for the skipped run
    # The retry runs like any run (the fixture's queued run runs too).
    assert drain() == {"succeeded": 1, "retried": 2, "failed": 1}


def test_retry_action_refuses_huge_selections(
    admin_client: Client, runs: dict[str, JobRun], monkeypatch: Any
) -> None:
    monkeypatch.setattr("kumiko_jobs.admin.run_actions.ACTION_LIMIT", 1)
    selected = [str(runs["failed"].pk), str(runs["unrecoverable"].pk)]
    response = admin_client.post(RUNS_URL, {"action": "retry_failed_runs", "_selected_action": selected})
    messages = [str(message) for message in get_messages(response.wsgi_request)]
    assert messages == ["Select at most 1 runs at once."]
    assert JobRun.objects.count() == len(runs)


def test_date_hierarchy_lists_periods_between_first_and_last_run(admin_client: Client) -> None:
    def run_at(when: datetime) -> JobRun:
        # Hand-made: dispatch() always queues "now", and the hierarchy needs past dates.
        return JobRun.objects.create(
            job_name="tests.record", lane="worker", job_id=uuid.uuid4().hex, queued_at=when
        )

    for when in (datetime(2024, 11, 30, 23, tzinfo=UTC), datetime(2025, 1, 2, tzinfo=UTC),
                 datetime(2025, 1, 5, 12, tzinfo=UTC)):  # fmt: skip
        run_at(when)
    runs = RunQuerySet(JobRun)
    assert [d.year for d in runs.datetimes("queued_at", "year")] == [2024, 2025]
    months = runs.datetimes("queued_at", "month")
    assert [(d.year, d.month) for d in months] == [(2024, 11), (2024, 12), (2025, 1)]
    january = runs.filter(queued_at__year=2025, queued_at__month=1).datetimes("queued_at", "day")
    assert [d.day for d in january] == [2, 3, 4, 5]
    assert set(january) >= set(JobRun.objects.filter(queued_at__year=2025).datetimes("queued_at", "day"))
    assert runs.none().datetimes("queued_at", "day") == []
    assert len(runs.datetimes("queued_at", "hour")) == 3  # finer kinds: Django's own query

    html = admin_client.get(RUNS_URL).content.decode()
    assert "?queued_at__year=2024" in html and "?queued_at__year=2025" in html
    response = admin_client.get(f"{RUNS_URL}?queued_at__year=2025&queued_at__month=1")
    assert response.status_code == 200
    assert "queued_at__day=4" in response.content.decode()
    assert len(response.context["cl"].result_list) == 2


def test_audit_admin_lists_rows_for_operators_only(
    admin_client: Client, staff_client: Any, tenants: list[Any]
) -> None:
    dispatch("tests.hatch", {}, tenant=tenants[0])
    assert drain() == {"succeeded": 1}
    audit = EscapeHatchAudit.objects.get()
    for query in ("", "?kind=unscoped", "?job_name=tests.hatch", "?q=hatch"):
        response = admin_client.get(f"{AUDITS_URL}{query}")
        assert response.status_code == 200
        assert list(response.context["cl"].result_list) == [audit], query
    html = response.content.decode()
    for text in ("tests.hatch", "unscoped", "tests read across tenants", "kumiko-system", str(tenants[0].pk)):
        assert text in html
    assert admin_client.get(f"{AUDITS_URL}?kind=as_user").context["cl"].result_count == 0
    assert admin_client.get(f"{AUDITS_URL}add/").status_code == 403
    assert admin_client.get(f"{AUDITS_URL}{audit.pk}/delete/").status_code == 403
    assert staff_client("staff-acme").get(AUDITS_URL).status_code == 403


def test_duration_format() -> None:
    from kumiko_jobs.admin.runs import format_duration

    assert [format_duration(timedelta(seconds=s)) for s in (0.0421, 3.25, 125, 7260)] == [
        "42 ms", "3.2 s", "2 min 05 s", "2 h 01 min",
    ]  # fmt: skip
