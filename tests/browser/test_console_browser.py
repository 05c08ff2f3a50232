"""The operator console as a person uses it, in headless Chromium against a live server:
overview and catalog, the Trigger form, retry and cancel, and tenant staff isolation."""

from __future__ import annotations

from typing import Any

import pytest

from kumiko_jobs import dispatch
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.testing import drain

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

OVERVIEW = "/admin/kumiko_jobs/consoleoverview/"
RUNS = "/admin/kumiko_jobs/jobrun/"


def row_texts(page: Any, selector: str) -> list[str]:
    return [text.strip() for text in page.locator(f"{selector} td").all_inner_texts()]


def test_overview_and_catalog(login: Any, live_server: Any, screenshot: Any, tenants: list[Any]) -> None:
    acme, globex, _ = tenants
    for n in range(3):
        dispatch("tests.record", {"n": n}, tenant=acme)
    dispatch("tests.unrecoverable", {}, tenant=globex)
    drain()
    dispatch("tests.record", {"n": 9}, tenant=globex)  # left queued

    page = login("operator", superuser=True)
    page.goto(f"{live_server.url}/admin/")
    page.click("text=Overview")
    page.wait_for_selector("#kj-lanes")
    # lane, queued, scheduled, running, succeeded, failed, retried, failed kept
    assert row_texts(page, 'tr[data-lane="worker"]') == ["worker", "1", "0", "0", "3", "1", "0", "1"]
    assert row_texts(page, f'tr[data-tenant="{globex.pk}"]')[1:] == ["Globex", "1", "0", "0", "0", "1"]
    charts = page.locator("svg.kj-chart")
    assert charts.count() == 2 and charts.first.is_visible()
    assert page.locator("svg.kj-chart rect").count() >= 2  # this hour's bars: succeeded and failed
    screenshot(page, "overview")

    page.click(".kj-tabs >> text=Job catalog")
    page.wait_for_selector("#kj-catalog")
    cells = row_texts(page, 'tr[data-job="tests.record"]')
    assert cells[1:3] == ["worker", "manual"] and cells[5:8] == ["3", "0", "0 %"]
    assert row_texts(page, 'tr[data-job="tests.unrecoverable"]')[5:8] == ["0", "1", "100 %"]
    screenshot(page, "catalog")

    # From the overview's failed count to the failed runs.
    page.goto(f"{live_server.url}{OVERVIEW}")
    page.click('tr[data-lane="worker"] td:nth-child(6) a')
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 1
    assert "UnrecoverableError: this cannot work" in page.inner_text("#result_list")
    screenshot(page, "failed-runs")


def test_trigger_form(login: Any, live_server: Any, screenshot: Any, tenants: list[Any]) -> None:
    page = login("operator", superuser=True)
    page.goto(f"{live_server.url}/admin/kumiko_jobs/jobcatalog/")
    page.click('tr[data-job="tests.export_invoice"] >> text=Trigger')
    page.wait_for_selector("#kj-trigger-form")
    page.select_option("#id_tenant", str(tenants[1].pk))
    page.fill("#id_payload", '{"invoice_id": 42, "format": ')
    page.click("input[name=_dispatch]")
    assert "Not valid JSON" in page.inner_text("#kj-trigger-form")
    page.fill("#id_payload", '{"invoice_id": {"nested": 1}}')
    page.click("input[name=_dispatch]")
    assert "subject field 'invoice_id'" in page.inner_text("#kj-trigger-form")
    screenshot(page, "refused")
    assert not JobRun.objects.exists()

    page.fill("#id_payload", '{"invoice_id": 42, "format": "pdf"}')
    page.click("input[name=_dispatch]")
    page.wait_for_selector(".messagelist")
    assert "Dispatched tests.export_invoice" in page.inner_text(".messagelist")
    run = JobRun.objects.get()
    assert (run.tenant_id, run.payload, run.trigger_name) == (
        str(tenants[1].pk),
        {"invoice_id": 42, "format": "pdf"},
        "admin",
    )
    screenshot(page, "dispatched")
    page.click(".messagelist a")
    page.wait_for_selector("text=Queued")
    assert str(run.pk) in page.inner_text("#content")
    screenshot(page, "run-detail")


def test_retry_and_cancel_actions(login: Any, live_server: Any, screenshot: Any, tenants: list[Any]) -> None:
    failed = dispatch("tests.unrecoverable", {"x": 1}, tenant=tenants[0])
    drain()
    waiting = dispatch("tests.limited", {}, tenant=tenants[0], delay=3600)
    page = login("operator", superuser=True)
    page.goto(f"{live_server.url}{RUNS}")
    page.check(f'input[name=_selected_action][value="{failed.run_id}"]')
    page.select_option("select[name=action]", "retry_failed_runs")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    assert "Re-dispatched 1 failed runs." in page.inner_text(".messagelist")
    retry = JobRun.objects.get(retry_of=failed.run_id)
    assert retry.status == RunStatus.QUEUED
    assert page.locator(f'a[href="{RUNS}{failed.run_id}/change/"][title^="the failed run"]').count() == 1
    screenshot(page, "retried")

    page.check(f'input[name=_selected_action][value="{waiting.run_id}"]')
    page.check(f'input[name=_selected_action][value="{retry.pk}"]')
    page.select_option("select[name=action]", "cancel_queued_runs")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    assert "Canceled 2 queued runs." in page.inner_text(".messagelist")
    assert set(JobRun.objects.filter(pk__in=[waiting.run_id, retry.pk]).values_list("status", flat=True)) == {
        RunStatus.DROPPED
    }
    screenshot(page, "canceled")
    assert drain() == {}  # nothing left to run
    # The original's detail page links to its retry.
    page.goto(f"{live_server.url}{RUNS}{failed.run_id}/change/")
    assert "Retried by" in page.inner_text("#content")


@pytest.mark.parametrize(("me", "other"), [("acme", "globex"), ("globex", "acme")])
def test_tenant_staff_see_only_their_tenant(
    login: Any, live_server: Any, screenshot: Any, tenants: list[Any], settings: Any, me: str, other: str
) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "USER_TENANT": "tests.conftest.tenant_of_staff"}
    by_slug = {tenant.slug: tenant for tenant in tenants}
    mine = dispatch("tests.export_invoice", {"invoice_id": 1, "fail": "always"}, tenant=by_slug[me])
    theirs = dispatch("tests.export_invoice", {"invoice_id": 2, "fail": "always"}, tenant=by_slug[other])
    hidden = dispatch("tests.record", {"n": 1}, tenant=by_slug[me])  # not tenant-visible
    drain()
    page = login(f"staff-{me}", permissions=("view_jobrun", "view_tenantfailure"))

    page.goto(f"{live_server.url}{RUNS}")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 1
    listing = page.inner_text("#result_list")
    assert "invoice_id" in listing and "Failed" in listing
    assert "secret provider text" not in page.content() and "RuntimeError" not in page.content()
    assert page.locator("select[name=action]").count() == 0
    screenshot(page, "runs")

    page.goto(f"{live_server.url}{RUNS}{mine.run_id}/change/")
    content = page.inner_text("#content")
    assert "Failed" in content and "secret provider" not in content and "Traceback" not in content
    screenshot(page, "own-run")

    for run_id in (theirs.run_id, hidden.run_id):
        page.goto(f"{live_server.url}{RUNS}{run_id}/change/")
        # Django's "doesn't exist" (the id they typed, nothing of the run) and back to the index.
        assert page.url.endswith("/admin/")
        assert "doesn\u2019t exist" in page.inner_text(".messagelist")
        assert "invoice_id" not in page.content() and "tests.record" not in page.content()
    screenshot(page, "other-run")
    response = page.goto(f"{live_server.url}{RUNS}?error__icontains=secret")
    assert response is not None and response.status == 400
    response = page.goto(f"{live_server.url}{OVERVIEW}")
    assert response is not None and response.status == 403

    page.goto(f"{live_server.url}/admin/kumiko_jobs/tenantfailure/")
    assert page.locator("#result_list tbody tr").count() == 1
    assert "billing.export_failed" in page.inner_text("#result_list")
    screenshot(page, "failures")
