"""The operator console: overview counts from Redis, the job catalog and its Trigger form,
run list columns and links, and the cancel action."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
import redis
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from kumiko_jobs import dispatch, lane_stats
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.retrying import retry_failed
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)

OVERVIEW = "/admin/kumiko_jobs/consoleoverview/"
CATALOG = "/admin/kumiko_jobs/jobcatalog/"
RUNS = "/admin/kumiko_jobs/jobrun/"


def trigger_url(name: str) -> str:
    return f"{CATALOG}trigger/{name}/"


def cells(html: str, row_attr: str) -> list[str]:
    """The text of the cells of the table row marked ``data-...="<value>"``."""
    row = re.search(rf"<tr {row_attr}>(.*?)</tr>", html, re.S)
    assert row, row_attr
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row[1], re.S)]


@pytest.fixture
def worked(tenants: list[Any]) -> dict[str, Any]:
    """Acme: 2 succeeded, 1 failed finally (after 2 retries); Globex: 1 succeeded, 2 queued."""
    acme, globex, _ = tenants
    dispatch("tests.record", {"n": 1}, tenant=acme)
    dispatch("tests.record", {"n": 2}, tenant=acme)
    dispatch("tests.flaky", {"succeed_on": 99}, tenant=acme)
    dispatch("tests.api_record", {}, tenant=globex)
    drain()
    queued = [dispatch("tests.record", {"n": n}, tenant=globex) for n in (3, 4)]
    return {"acme": acme, "globex": globex, "queued": queued}


def test_outcome_counters_per_hour_job_and_tenant(worked: dict[str, Any], redis_client: redis.Redis) -> None:
    keys = get_keys()
    hours = lane_stats.hourly(redis_client, keys, "worker")
    assert len(hours) == 24 and hours[-1].start == lane_stats.current_hour() * 3600
    assert hours[-1].counts == {"succeeded": 2, "failed": 1, "retried": 2, "deferred": 0}
    assert lane_stats.hourly(redis_client, keys, "api")[-1].get("succeeded") == 1
    jobs = lane_stats.job_outcomes(redis_client, keys)
    assert (
        jobs["tests.record"]["succeeded"],
        jobs["tests.flaky"]["failed"],
        jobs["tests.flaky"]["retried"],
    ) == (2, 1, 2)
    acme, globex = str(worked["acme"].pk), str(worked["globex"].pk)
    per_tenant = lane_stats.tenant_outcomes(redis_client, keys, [acme, globex, None])
    assert (per_tenant[acme]["succeeded"], per_tenant[acme]["failed"]) == (2, 1)
    assert (per_tenant[globex]["succeeded"], per_tenant[globex]["failed"]) == (1, 0)
    assert lane_stats.ranked_tenants(redis_client, keys, failures_only=True) == [(acme, 1)]
    assert lane_stats.ranked_tenants(redis_client, keys) == [(acme, 3), (globex, 1)]
    # The counters expire on their own.
    ttl = redis_client.ttl(keys.stats("worker", lane_stats.current_hour()))
    assert 25 * 3600 < ttl <= 26 * 3600


def test_counters_of_hours_gone_by_leave_the_window(redis_client: redis.Redis) -> None:
    keys = get_keys()
    now = time.time()
    old = lane_stats.current_hour(now) - 24  # one hour too old
    redis_client.hset(keys.stats("worker", old), "succeeded", 5)
    redis_client.hset(keys.stats("worker", old + 1), "succeeded", 7)
    assert sum(h.get("succeeded") for h in lane_stats.hourly(redis_client, keys, "worker", now=now)) == 7


def test_overview_shows_lanes_tenants_and_charts_without_querying_runs(
    admin_client: Client, worked: dict[str, Any]
) -> None:
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(OVERVIEW)
    assert response.status_code == 200
    assert not [q["sql"] for q in captured.captured_queries if "kumiko_jobs_jobrun" in q["sql"]]
    html = response.content.decode()
    # lane, queued, scheduled, running, succeeded, failed, retried, failed kept
    assert cells(html, 'data-lane="worker"') == ["worker", "2", "0", "0", "2", "1", "2", "1"]
    assert cells(html, 'data-lane="api"') == ["api", "0", "0", "0", "1", "0", "0", "0"]
    acme, globex = worked["acme"], worked["globex"]
    assert cells(html, f'data-tenant="{globex.pk}"') == [str(globex.pk), "Globex", "2", "0", "0", "1", "0"]
    assert cells(html, f'data-tenant="{acme.pk}"') == [str(acme.pk), "Acme Corp", "0", "0", "0", "2", "1"]
    assert 'data-tenant="-"' not in html  # no system runs ended
    assert html.count('<svg class="kj-chart"') == 2
    assert "3:00" in html or ":00</text>" in html
    # Searching a tenant with nothing going on still shows its row.
    quiet = worked["globex"].__class__.objects.get(slug="initech")
    html = admin_client.get(f"{OVERVIEW}?tenant={quiet.pk}").content.decode()
    assert cells(html, f'data-tenant="{quiet.pk}"')[1:] == ["Initech", "0", "0", "0", "0", "0"]


def test_overview_reports_an_unreachable_redis(admin_client: Client, settings: Any) -> None:
    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "REDIS_URL": "redis://:hunter2@127.0.0.1:1/0",
        "REDIS_TIMEOUT": 0.2,
    }
    response = admin_client.get(OVERVIEW)
    assert response.status_code == 200
    assert "did not answer" in response.content.decode()
    assert "hunter2" not in response.content.decode()  # the URL's password is never shown


def test_console_pages_are_linked_from_the_app_index_for_operators(admin_client: Client) -> None:
    html = admin_client.get("/admin/kumiko_jobs/").content.decode()
    for link in (OVERVIEW, CATALOG, RUNS, "/admin/kumiko_jobs/tenantfailure/"):
        assert f'href="{link}"' in html, link


def test_catalog_lists_every_job_with_triggers_next_fire_last_success_and_failure_rate(
    admin_client: Client, worked: dict[str, Any]
) -> None:
    response = admin_client.get(CATALOG)
    assert response.status_code == 200
    html = response.content.decode()
    prune = cells(html, 'data-job="kumiko_jobs.prune_history"')
    assert prune[1:3] == ["worker", "cron:17 3 * * * UTC"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d 03:17:00", prune[3]), prune
    flaky = cells(html, 'data-job="tests.flaky"')
    assert flaky[2:4] == ["manual", "-"]
    assert flaky[4] == "-"  # never succeeded
    assert flaky[5:8] == ["0", "1", "100 %"]
    record = cells(html, 'data-job="tests.record"')
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", record[4])
    assert record[5:8] == ["2", "0", "0 %"]
    on_invoice = cells(html, 'data-job="tests.on_invoice"')[2]
    assert on_invoice == "event:invoice.created, event:invoice.paid kind=&#x27;refund&#x27;"
    assert 'href="/admin/kumiko_jobs/jobcatalog/trigger/tests.flaky/"' in html


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ("{not json", "Not valid JSON"),
        ("[1, 2]", "must be a JSON object, not a list"),
        ('{"invoice_id": [1]}', "subject field &#x27;invoice_id&#x27;"),
        ('{"n": NaN}', "not representable in JSON"),
    ],
)
def test_trigger_form_refuses_bad_payloads_before_dispatching(
    admin_client: Client, tenants: list[Any], payload: str, error: str
) -> None:
    response = admin_client.post(
        trigger_url("tests.export_invoice"), {"tenant": str(tenants[0].pk), "payload": payload}
    )
    assert response.status_code == 200
    assert error in response.content.decode()
    assert not JobRun.objects.exists()


def test_trigger_form_refuses_an_unknown_tenant(admin_client: Client) -> None:
    response = admin_client.post(trigger_url("tests.record"), {"tenant_id": "999999", "payload": "{}"})
    assert "does not exist" in response.content.decode()
    assert not JobRun.objects.exists()


def test_trigger_form_dispatches_through_the_library(
    admin_client: Client, tenants: list[Any], admin_user: Any
) -> None:
    form = admin_client.get(trigger_url("tests.record"))
    assert form.status_code == 200
    assert "Acme Corp" in form.content.decode()
    response = admin_client.post(
        trigger_url("tests.record"), {"tenant": str(tenants[1].pk), "payload": '{"n": 7}'}
    )
    assert response.status_code == 302
    run = JobRun.objects.get()
    assert (run.job_name, run.tenant_id, run.payload, run.status) == (
        "tests.record",
        str(tenants[1].pk),
        {"n": 7},
        "queued",
    )
    assert (run.trigger_name, run.triggered_by) == ("admin", str(admin_user.pk))
    (message,) = [str(m) for m in get_messages(response.wsgi_request)]
    assert f"/admin/kumiko_jobs/jobrun/{run.pk}/change/" in message
    assert drain() == {"succeeded": 1}


def test_trigger_form_reports_a_gate_that_refuses(admin_client: Client, tenants: list[Any]) -> None:
    data = {"tenant": str(tenants[0].pk), "payload": "{}"}
    for _ in range(3):  # its max_per_tenant
        admin_client.post(trigger_url("tests.limited"), data)
    response = admin_client.post(trigger_url("tests.limited"), data)
    assert response.status_code == 200
    assert "Not queued: skipped (max_per_tenant)" in response.content.decode()


def test_trigger_of_an_unknown_job_is_404(admin_client: Client) -> None:
    assert admin_client.get(trigger_url("no.such_job")).status_code == 404


def test_run_list_shows_error_summary_and_links_between_related_runs(
    admin_client: Client, tenants: list[Any]
) -> None:
    failed = JobRun.objects.get(pk=dispatch("tests.unrecoverable", {}, tenant=tenants[0]).run_id)
    dispatch("tests.per_tenant", {})
    drain()
    failed.refresh_from_db()
    retry = JobRun.objects.get(pk=retry_failed(failed).run_id)
    html = admin_client.get(RUNS).content.decode()
    assert "UnrecoverableError: this cannot work" in html
    assert (
        f'href="/admin/kumiko_jobs/jobrun/{failed.pk}/change/" title="the failed run this one retries"'
        in html
    )
    wrapper = JobRun.objects.get(job_name="_per_tenant:tests.per_tenant")
    children = admin_client.get(f"{RUNS}?fanout_parent={wrapper.job_id}")
    assert {run.tenant_id for run in children.context["cl"].result_list} == {str(t.pk) for t in tenants}

    detail = admin_client.get(f"{RUNS}{failed.pk}/change/").content.decode()
    assert "Retried by" in detail and str(retry.pk) in detail
    child = JobRun.objects.filter(fanout_parent=wrapper.job_id).first()
    assert child is not None
    detail = admin_client.get(f"{RUNS}{child.pk}/change/").content.decode()
    assert "Fan-out wrapper" in detail and f"/admin/kumiko_jobs/jobrun/{wrapper.pk}/change/" in detail
    chain = admin_client.get(f"{RUNS}?correlation_id={failed.correlation_id}")
    assert {run.pk for run in chain.context["cl"].result_list} == {failed.pk, retry.pk}


def test_cancel_action_drops_waiting_runs_and_releases_their_limits_once(
    admin_client: Client, tenants: list[Any], redis_client: redis.Redis
) -> None:
    acme = tenants[0]
    first, second, _third = (dispatch("tests.limited", {}, tenant=acme) for _ in range(3))
    assert dispatch("tests.limited", {}, tenant=acme).status == "skipped"  # max_per_tenant=3
    later = dispatch("tests.record", {"n": 1}, tenant=acme, delay=3600)  # scheduled
    done = dispatch("tests.api_record", {}, tenant=acme)
    drain(lanes=("api",))
    ids = [first.run_id, later.run_id, done.run_id]
    response = admin_client.post(RUNS, {"action": "cancel_queued_runs", "_selected_action": ids})
    messages = [str(m) for m in get_messages(response.wsgi_request)]
    assert messages[0] == "Canceled 2 queued runs."
    assert messages[1].startswith("Not canceled 1: tests.api_record") and "(succeeded)" in messages[1]
    statuses = dict(JobRun.objects.filter(pk__in=ids).values_list("pk", "status"))
    assert [statuses[JobRun.objects.get(pk=i).pk] for i in ids] == ["dropped", "dropped", "succeeded"]
    assert redis_client.zcard(get_keys().scheduled("worker")) == 0
    # One slot freed: exactly one more run is admitted.
    assert dispatch("tests.limited", {}, tenant=acme).status == "queued"
    assert dispatch("tests.limited", {}, tenant=acme).status == "skipped"
    # Cancelling again releases nothing twice.
    admin_client.post(RUNS, {"action": "cancel_queued_runs", "_selected_action": [first.run_id]})
    assert dispatch("tests.limited", {}, tenant=acme).status == "skipped"
    assert drain() == {"succeeded": 3}  # second, third and the new one: canceled runs never run
    assert JobRun.objects.get(pk=second.run_id).status == RunStatus.SUCCEEDED


def test_the_ranking_cache_keeps_only_live_entries(redis_client: redis.Redis) -> None:
    """Keyed by the hour: each hour the console is looked at left an entry in a long-lived web
    process."""
    from kumiko_jobs import lane_stats
    from kumiko_jobs.connection import get_keys

    lane_stats._rank_cache.clear()
    for hour in range(5):  # five past hours, each expired
        lane_stats._rank_cache[("p", False, hour, 24)] = (time.monotonic() - 1, [])
    lane_stats.ranked_tenants(redis_client, get_keys())
    assert len(lane_stats._rank_cache) == 1
