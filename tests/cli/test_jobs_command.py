"""``manage.py jobs list|trigger|stats``: JSON shapes for scripts, tables for people, hints on errors."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from kumiko_jobs import cron, dispatch
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.registry import build_definition, registry
from kumiko_jobs.scheduling import refresh_tenant_zones
from kumiko_jobs.testing import drain
from tests.testapp.tenants import set_zones

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> str:
    out = StringIO()
    call_command("jobs", *args, stdout=out)
    return out.getvalue()


def noop(payload: dict[str, Any], ctx: Any) -> None:
    pass


def test_list_json_shape_and_last_success() -> None:
    dispatch("tests.record", {"n": 1})
    drain()

    listed = {job["name"]: job for job in json.loads(run("list", "--json"))}

    assert listed["tests.on_invoice"] == {
        "name": "tests.on_invoice",
        "lane": "worker",
        "triggers": ["event:invoice.created", "event:invoice.paid kind='refund'"],
        "next_fire_at": None,
        "last_success_at": None,
    }
    finished = JobRun.objects.get(job_name="tests.record", status=RunStatus.SUCCEEDED).finished_at
    assert finished is not None and listed["tests.record"]["last_success_at"] == finished.isoformat()
    assert listed["tests.api_record"]["lane"] == "api"


def test_list_shows_next_fire_times_in_utc_and_in_the_zone(tenants: Any) -> None:
    set_zones({str(tenants[0].pk): "Asia/Tokyo"})
    refresh_tenant_zones()
    with registry.isolated():
        registry.register(
            build_definition(noop, "t.berlin", {"trigger": cron("0 7 * * *", tz="Europe/Berlin")})
        )
        registry.register(
            build_definition(
                noop, "t.local", {"trigger": cron("30 6 * * *", tz="tenant"), "per_tenant": True}
            )
        )
        registry.register(build_definition(noop, "t.manual", {}))
        listed = {job["name"]: job for job in json.loads(run("list", "--json"))}
        table = run("list")

    from kumiko_jobs.scheduling.cronmath import as_utc, next_tick

    berlin = next_tick("0 7 * * *", "Europe/Berlin", __import__("time").time())
    assert berlin is not None
    assert listed["t.berlin"]["triggers"] == ["cron:0 7 * * * Europe/Berlin"]
    assert listed["t.berlin"]["next_fire_at"] == as_utc(berlin).isoformat()
    # tz="tenant": the earliest of the zones in use (Tokyo and UTC here).
    local = [next_tick("30 6 * * *", zone, __import__("time").time()) for zone in ("Asia/Tokyo", "UTC")]
    assert listed["t.local"]["next_fire_at"] == as_utc(min(t for t in local if t)).isoformat()
    assert listed["t.manual"]["next_fire_at"] is None
    assert "07:00:00 CE" in table and "(Europe/Berlin)" in table  # CET or CEST, by season
    assert f"{as_utc(berlin):%Y-%m-%d %H:%M:%S} UTC" in table


def test_trigger_prints_the_run_id(traces: Any) -> None:
    run_id = run("trigger", "tests.record", "--payload", '{"n": 7}').strip()

    run_row = JobRun.objects.get(pk=run_id)
    assert (run_row.job_name, run_row.payload, run_row.trigger_name) == ("tests.record", {"n": 7}, "manual")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("trigger", "tests.recrod"), "Unknown job 'tests.recrod'. Did you mean: tests.record"),
        (("trigger", "tests.record", "--payload", "{nope"), "--payload is not valid JSON"),
        (("trigger", "tests.record", "--payload", "[1]"), "--payload must be a JSON object"),
        (("trigger", "tests.record", "--tenant", "999999"), "Tenant '999999' does not exist"),
    ],
)
def test_trigger_errors_have_hints(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace("[", r"\[")):
        run(*args)


def test_stats_json_counts_per_lane(tenants: Any) -> None:
    for _ in range(3):
        dispatch("tests.record", {}, tenant=tenants[0])
    dispatch("tests.record", {}, tenant=tenants[1], delay=60)
    dispatch("tests.api_record", {})

    stats = json.loads(run("stats", "--json"))
    table = run("stats")

    assert stats == {
        "api": {"queued": 1, "scheduled": 0, "running": 0, "failed": 0},
        "worker": {"queued": 3, "scheduled": 1, "running": 0, "failed": 0},
    }
    assert f"{tenants[0].pk} (3)" in table


def test_rebuild_pushes_what_redis_lost_and_dry_run_only_counts(
    redis_client: Any, kumiko_prefix: str
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    runs = [dispatch("tests.record", {"n": n}) for n in range(3)]
    JobRun.objects.update(updated_at=timezone.now() - timedelta(minutes=5))
    redis_client.delete(*redis_client.scan_iter(match=f"*{kumiko_prefix}*"))  # Redis lost it all
    assert json.loads(run("rebuild", "--dry-run", "--json"))["worker"] == {
        "checked": 3,
        "missing": 3,
        "pushed": 0,
    }
    assert json.loads(run("rebuild", "--json"))["worker"] == {"checked": 3, "missing": 3, "pushed": 3}
    assert json.loads(run("rebuild", "--json"))["worker"]["missing"] == 0
    assert "Unfinished runs checked against Redis" in run("rebuild")
    assert drain() == {"succeeded": 3}
    assert {JobRun.objects.get(pk=r.run_id).status for r in runs} == {RunStatus.SUCCEEDED}
