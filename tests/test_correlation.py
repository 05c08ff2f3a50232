"""Correlation: CorrelationMiddleware gives jobs dispatched in a request its id; the admin shows
the id on each run and filters by it; chained jobs keep it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory

from kumiko_jobs import dispatch
from kumiko_jobs.middleware import CorrelationMiddleware
from kumiko_jobs.models import JobRun
from kumiko_jobs.observability import correlation_scope, current_correlation_id
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)
RUNS_URL = "/admin/kumiko_jobs/jobrun/"


def post_note(client: Client, slug: str, **headers: str) -> Any:
    return client.post(f"/demo/{slug}/notes/", {"text": "hi"}, headers=headers)


def test_a_valid_request_id_becomes_the_runs_correlation_id(tenants: list[Any]) -> None:
    response = post_note(Client(), tenants[0].slug, **{"X-Request-ID": "req-2026.12/abc:1"})
    assert response.status_code == 202
    assert response.headers["X-Request-ID"] == "req-2026.12/abc:1"
    assert response.json()["correlation_id"] == "req-2026.12/abc:1"
    assert JobRun.objects.get(pk=response.json()["run_id"]).correlation_id == "req-2026.12/abc:1"


@pytest.mark.parametrize(
    "sent",
    ["x" * 65, "has space", "semi;colon", "<script>", "ann@example.com", "", "line\nbreak"],
)
def test_an_invalid_request_id_is_replaced_by_a_new_one(tenants: list[Any], sent: str) -> None:
    request = RequestFactory().get("/", headers={"X-Request-ID": sent})
    seen: list[str | None] = []

    def view(request: HttpRequest) -> HttpResponse:
        seen.append(current_correlation_id())
        return HttpResponse("ok")

    response = CorrelationMiddleware(view)(request)
    assert isinstance(response, HttpResponse)
    [correlation_id] = seen
    assert correlation_id != sent and correlation_id is not None and len(correlation_id) == 32
    assert response.headers["X-Request-ID"] == correlation_id == request.correlation_id  # type: ignore[attr-defined]


def test_without_a_header_each_request_gets_its_own_id(tenants: list[Any]) -> None:
    client = Client()
    first, second = (post_note(client, tenants[0].slug).json() for _ in range(2))
    assert first["correlation_id"] != second["correlation_id"]
    assert JobRun.objects.get(pk=first["run_id"]).correlation_id == first["correlation_id"]


def test_the_middleware_works_on_an_async_stack() -> None:
    async def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse(current_correlation_id() or "")

    middleware = CorrelationMiddleware(view)
    response = asyncio.run(middleware(RequestFactory().get("/", headers={"X-Request-ID": "async-1"})))  # type: ignore[arg-type]
    assert response.content == b"async-1" and response.headers["X-Request-ID"] == "async-1"
    assert current_correlation_id() is None  # the scope ended with the request


def test_chained_jobs_keep_the_correlation_id(traces: Any) -> None:
    with correlation_scope("req-chain-2"):
        dispatch("tests.chain", {})
    drain()
    assert {t["corr"] for t in traces()} == {"req-chain-2"}
    assert set(JobRun.objects.values_list("correlation_id", flat=True)) == {"req-chain-2"}


def test_admin_shows_the_correlation_id_and_filters_by_it(admin_client: Client, tenants: list[Any]) -> None:
    with correlation_scope("req-admin-1"):
        mine = {dispatch("tests.record", {}, tenant=t).job_id for t in tenants[:2]}
    other = dispatch("tests.record", {}).job_id
    html = admin_client.get(RUNS_URL).content.decode()
    assert '<a href="?correlation_id=req-admin-1" title="req-admin-1">req-admin-1</a>' in html
    assert "By correlation id" not in html  # the filter shows only while it is active

    response = admin_client.get(f"{RUNS_URL}?correlation_id=req-admin-1")
    assert {run.job_id for run in response.context["cl"].result_list} == mine
    assert "By correlation id" in response.content.decode()

    searched = admin_client.get(f"{RUNS_URL}?q=req-admin-1")
    assert {run.job_id for run in searched.context["cl"].result_list} == mine
    assert other not in {run.job_id for run in searched.context["cl"].result_list}


def test_long_correlation_ids_are_shortened_in_the_list(admin_client: Client) -> None:
    result = dispatch("tests.record", {})
    correlation_id = JobRun.objects.get(pk=result.run_id).correlation_id  # the run id's hex
    html = admin_client.get(RUNS_URL).content.decode()
    assert f'title="{correlation_id}">{correlation_id[:10]}…</a>' in html
