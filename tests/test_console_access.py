"""Tenant staff in the admin: only their tenant's tenant-visible runs and failure records, never
payload, error text, traceback or logs; refused lookups, object URLs and actions for the rest."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client

from kumiko_jobs import dispatch
from kumiko_jobs.models import JobRun, RunStatus, TenantFailure
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/kumiko_jobs/jobrun/"
FAILURES = "/admin/kumiko_jobs/tenantfailure/"
EXPORT = "tests.export_invoice"
PROVIDER_TEXT = "secret provider text"
# With a space: a run's time-ordered id once held "4111" (its hex digits), and the bare number
# was "found" in the page.
CARD = "4111 1111"


@pytest.fixture
def history(tenants: list[Any]) -> dict[str, JobRun]:
    """Per tenant: a visible failed export, a visible queued export, and a run of a job that is
    not tenant-visible."""
    acme, globex, _ = tenants
    results = {
        "acme_failed": dispatch(EXPORT, {"invoice_id": 1, "fail": "always", "card": CARD}, tenant=acme),
        "globex_failed": dispatch(EXPORT, {"invoice_id": 2, "fail": "always", "card": "4222"}, tenant=globex),
        "acme_hidden": dispatch("tests.record", {"n": 1}, tenant=acme),
    }
    drain()
    results["acme_queued"] = dispatch(EXPORT, {"invoice_id": 3}, tenant=acme)
    results["globex_queued"] = dispatch(EXPORT, {"invoice_id": 4}, tenant=globex)
    return {key: JobRun.objects.get(pk=result.run_id) for key, result in results.items()}


def listed(response: Any) -> set[Any]:
    return {row.pk for row in response.context["cl"].result_list}


def test_staff_list_shows_their_tenants_visible_runs_with_safe_columns(
    staff_client: Any, history: dict[str, JobRun]
) -> None:
    response = staff_client("staff-acme").get(RUNS)
    assert response.status_code == 200
    assert listed(response) == {history["acme_failed"].pk, history["acme_queued"].pk}
    html = response.content.decode()
    assert "[[&quot;format&quot;,null],[&quot;invoice_id&quot;,1]]" in html  # the subject
    for hidden in (PROVIDER_TEXT, "RuntimeError", CARD, "By tenant", "Retry selected", "Cancel selected"):
        assert hidden not in html, hidden
    # The queryset itself holds only the safe columns.
    run = response.context["cl"].result_list[0]
    assert not {"payload", "error", "traceback", "logs", "worker"} & set(vars(run))


def test_staff_detail_shows_status_subject_and_times_only(
    staff_client: Any, history: dict[str, JobRun]
) -> None:
    run = history["acme_failed"]
    response = staff_client("staff-acme").get(f"{RUNS}{run.pk}/change/")
    assert response.status_code == 200
    html = response.content.decode()
    for shown in ("Failed", "invoice_id", "Queued at", "Finished at"):
        assert shown in html, shown
    for hidden in (
        PROVIDER_TEXT,
        "Traceback",
        CARD,
        "Payload",
        "Logs",
        run.worker,
        "Correlation id",
        "Worker",
    ):
        assert hidden not in html, hidden


@pytest.mark.parametrize("key", ["globex_failed", "globex_queued", "acme_hidden"])
def test_staff_cannot_reach_another_tenants_or_a_hidden_run_by_url(
    staff_client: Any, history: dict[str, JobRun], key: str
) -> None:
    client = staff_client("staff-acme")
    run = history[key]
    for suffix in ("change/", "history/"):
        response = client.get(f"{RUNS}{run.pk}/{suffix}")
        assert response.status_code in (302, 404), suffix
        assert run.job_id not in response.content.decode()


@pytest.mark.parametrize(
    "query",
    [
        "error__icontains=secret",
        "payload__card=4222",
        "payload__icontains=4222",
        "traceback__icontains=RuntimeError",
        "logs__icontains=secret",
        "worker__icontains=drain",
        "tenant_id=OTHER",
        "tenant_visible=0",
        "tenant_visible__exact=False",
        "triggered_by__isnull=True",
    ],
)
def test_staff_cannot_probe_hidden_fields_or_tenants_through_the_query_string(
    staff_client: Any, history: dict[str, JobRun], tenants: list[Any], query: str
) -> None:
    response = staff_client("staff-acme").get(f"{RUNS}?{query.replace('OTHER', str(tenants[1].pk))}")
    assert response.status_code == 400


def test_staff_may_use_the_filter_spellings_of_djangos_own_list_filters(
    staff_client: Any, history: dict[str, JobRun]
) -> None:
    client = staff_client("staff-acme")
    response = client.get(f"{RUNS}?job_name__exact={EXPORT}&lane__exact=worker&status__exact=failed")
    assert response.status_code == 200
    assert listed(response) == {history["acme_failed"].pk}


def test_staff_tenant_filter_names_no_other_tenant(
    staff_client: Any, history: dict[str, JobRun], tenants: list[Any]
) -> None:
    client = staff_client("staff-acme")
    # Not a filter of theirs, and not a lookup they may use: refused, not silently ignored.
    assert client.get(f"{RUNS}?tenant={tenants[1].pk}").status_code == 400
    # A search for another tenant's run id finds nothing.
    response = client.get(f"{RUNS}?q={history['globex_failed'].pk}")
    assert response.status_code == 200 and listed(response) == set()


@pytest.mark.parametrize(
    "query",
    [
        "error__icontains=secret",
        "payload__card=4222",
        "traceback__icontains=RuntimeError",
        "logs__icontains=secret",
    ],
)
def test_operators_cannot_filter_on_unindexed_text_either(
    admin_client: Client, history: Any, query: str
) -> None:
    # A full scan of the run table per page load, and no list filter offers it.
    assert admin_client.get(f"{RUNS}?{query}").status_code == 400


@pytest.mark.parametrize("action", ["retry_failed_runs", "cancel_queued_runs", "delete_selected"])
def test_staff_action_posts_do_nothing(staff_client: Any, history: dict[str, JobRun], action: str) -> None:
    client = staff_client("staff-acme")
    targets = [
        history["globex_failed"],
        history["globex_queued"],
        history["acme_failed"],
        history["acme_queued"],
    ]
    before = dict(JobRun.objects.values_list("pk", "status"))
    response = client.post(RUNS, {"action": action, "_selected_action": [str(run.pk) for run in targets]})
    # They have no actions: the post is a plain list view, nothing runs.
    assert response.status_code == 200
    assert "action-checkbox" not in response.content.decode()
    assert not [str(m) for m in get_messages(response.wsgi_request)]
    assert dict(JobRun.objects.values_list("pk", "status")) == before
    assert JobRun.objects.count() == len(history)


def test_operator_actions_only_touch_the_selected_runs(
    admin_client: Client, history: dict[str, JobRun]
) -> None:
    response = admin_client.post(
        RUNS, {"action": "cancel_queued_runs", "_selected_action": [str(history["globex_queued"].pk)]}
    )
    assert "Canceled 1 queued runs." in [str(m) for m in get_messages(response.wsgi_request)]
    statuses = dict(JobRun.objects.values_list("pk", "status"))
    assert statuses[history["globex_queued"].pk] == RunStatus.DROPPED
    assert statuses[history["acme_queued"].pk] == RunStatus.QUEUED


def test_staff_failure_list_is_their_tenants_and_shows_no_run(
    staff_client: Any, history: dict[str, JobRun], tenants: list[Any]
) -> None:
    client = staff_client("staff-acme")
    response = client.get(FAILURES)
    assert response.status_code == 200
    (failure,) = response.context["cl"].result_list
    assert failure.tenant_id == str(tenants[0].pk)
    html = response.content.decode()
    assert "billing.export_failed" in html
    for hidden in (PROVIDER_TEXT, str(history["acme_failed"].pk), "last failed run"):
        assert hidden not in html, hidden
    other = TenantFailure.objects.get(tenant_id=tenants[1].pk)
    assert client.get(f"{FAILURES}{other.pk}/change/").status_code in (302, 404)
    for query in (f"tenant_id={tenants[1].pk}", "last_run_id__isnull=False", "subject__icontains=2"):
        assert client.get(f"{FAILURES}?{query}").status_code == 400, query


def test_staff_see_no_console_pages(staff_client: Any, history: dict[str, JobRun]) -> None:
    client = staff_client("staff-acme")
    for url in (
        "/admin/kumiko_jobs/consoleoverview/",
        "/admin/kumiko_jobs/jobcatalog/",
        f"/admin/kumiko_jobs/jobcatalog/trigger/{EXPORT}/",
    ):
        assert client.get(url).status_code == 403, url
    response = client.post(f"/admin/kumiko_jobs/jobcatalog/trigger/{EXPORT}/", {"payload": "{}"})
    assert response.status_code == 403
    index = client.get("/admin/kumiko_jobs/").content.decode()
    assert "consoleoverview" not in index and "jobcatalog" not in index
    assert "/admin/kumiko_jobs/jobrun/" in index and "/admin/kumiko_jobs/tenantfailure/" in index


def test_the_other_tenants_staff_see_the_mirror_image(staff_client: Any, history: dict[str, JobRun]) -> None:
    response = staff_client("staff-globex").get(RUNS)
    assert listed(response) == {history["globex_failed"].pk, history["globex_queued"].pk}
    assert staff_client("staff-globex-2").get(RUNS).status_code == 403  # no tenant: nothing


def test_a_user_tenant_hook_may_spell_the_tenant_key_another_way(
    staff_client: Any, history: dict[str, JobRun], settings: Any
) -> None:
    """USER_TENANT returning "007" for tenant 7 showed staff nothing: run records keep the
    canonical key, as dispatch(tenant=...) makes it."""
    client = staff_client("staff-acme")
    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "USER_TENANT": "tests.conftest.tenant_of_staff_spelled_long",
    }
    assert listed(client.get(RUNS)) == {history["acme_failed"].pk, history["acme_queued"].pk}
