"""cron(..., tz="tenant"): each tenant at its own local time, tenants grouped by zone."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection  # noqa: F401  (the skipif condition reads it)

from kumiko_jobs import cron
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.models import JobRun
from kumiko_jobs.scheduling import refresh_tenant_zones
from kumiko_jobs.scheduling.zones import current_index, tenants_in_zone
from kumiko_jobs.testing import drain
from tests.scheduling.conftest import utc
from tests.testapp.tenants import set_zones

pytestmark = pytest.mark.django_db(transaction=True)
ZONES = ("Europe/Berlin", "America/New_York", "Asia/Tokyo")


def test_tenant_local_job_fires_at_0700_in_each_tenants_zone(
    declare: Any, make_leader: Any, tenants: Any, traces: Any
) -> None:
    set_zones({str(t.pk): zone for t, zone in zip(tenants, ZONES, strict=True)})
    assert refresh_tenant_zones() == 3
    declare("t.morning", trigger=cron("0 7 * * *", tz="tenant"), per_tenant=True)
    leader = make_leader(utc(2025, 6, 1))

    leader.run_until(utc(2025, 6, 2))
    drain()

    runs = {t["tenant"]: datetime.fromisoformat(t["scheduled_at"]) for t in traces("tick")}
    assert len(traces("tick")) == 3
    for tenant, zone in zip(tenants, ZONES, strict=True):
        local = runs[str(tenant.pk)].astimezone(ZoneInfo(zone))
        assert (local.hour, local.minute) == (7, 0), (zone, local)
    # One wrapper per zone and tick, each with its own zone's tenants.
    wrappers = JobRun.objects.filter(job_name="_per_tenant:t.morning")
    assert sorted(w.fanout_count or 0 for w in wrappers) == [1, 1, 1]


def test_leader_work_per_tick_is_per_zone_not_per_tenant(
    declare: Any, make_leader: Any, tenants: Any, settings: Any
) -> None:
    # 2,000 tenants in two zones: one tick makes two wrappers, whatever the tenant count.
    many = [str(i) for i in range(2000)]
    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "ACTIVE_TENANTS": "tests.scheduling.test_zones.many_tenants",
    }
    set_zones({tenant: ZONES[int(tenant) % 2] for tenant in many})
    refresh_tenant_zones()
    declare("t.morning", trigger=cron("0 7 * * *", tz="tenant"), per_tenant=True)
    leader = make_leader(utc(2025, 6, 1))
    LISTED.clear()

    leader.run_until(utc(2025, 6, 1, 12))

    assert LISTED == []  # the leader read no tenant list: the index (zones, counts) is enough
    assert JobRun.objects.filter(job_name="_per_tenant:t.morning").count() == 2
    assert JobRun.objects.filter(job_name="t.morning").count() == 0  # children: the wrappers' work
    assert sum(1 for _ in tenants_in_zone("Europe/Berlin")) == 1000


# Each call of many_tenants (ACTIVE_TENANTS), for the test above.
LISTED: list[int] = []


def many_tenants() -> list[str]:
    LISTED.append(1)
    return [str(i) for i in range(2000)]


def test_a_tenant_that_changes_zone_moves_at_the_next_refresh(tenants: Any) -> None:
    acme = str(tenants[0].pk)
    set_zones({acme: "Europe/Berlin"})
    refresh_tenant_zones()
    assert acme in list(tenants_in_zone("Europe/Berlin"))

    set_zones({acme: "Asia/Tokyo"})
    assert acme in list(tenants_in_zone("Europe/Berlin"))  # until the index is rebuilt
    refresh_tenant_zones()

    assert acme not in list(tenants_in_zone("Europe/Berlin"))
    assert acme in list(tenants_in_zone("Asia/Tokyo"))
    index = current_index(get_redis(), get_keys())
    assert index is not None and index.zones == {"Asia/Tokyo": 1, "UTC": 2}


def test_an_invalid_zone_is_scheduled_in_utc_and_logged(
    tenants: Any, caplog: pytest.LogCaptureFixture
) -> None:
    set_zones({str(tenants[0].pk): "Mars/Olympus"})
    with caplog.at_level(logging.WARNING, logger="kumiko_jobs"):
        refresh_tenant_zones()

    assert str(tenants[0].pk) in list(tenants_in_zone("UTC"))
    assert f"{tenants[0].pk}='Mars/Olympus'" in caplog.text


def test_a_database_failing_the_zone_lookup_keeps_the_installed_index(tenants: Any) -> None:
    """TENANT_TIMEZONE raising a database error is the database, not a tenant's bad zone: the
    rebuild is given up, not installed with every tenant in UTC (the planner would drop the
    other zones' cursors, and their ticks would be missed)."""
    from django.db import OperationalError

    from tests.testapp.tenants import DATABASE_DOWN

    acme = str(tenants[0].pk)
    set_zones({acme: "Europe/Berlin"})
    refresh_tenant_zones()
    installed = current_index(get_redis(), get_keys())
    set_zones({acme: DATABASE_DOWN.decode()})

    with pytest.raises(OperationalError):
        refresh_tenant_zones()

    assert current_index(get_redis(), get_keys()) == installed
    assert acme in list(tenants_in_zone("Europe/Berlin"))


def test_a_query_that_fails_for_one_tenant_puts_that_tenant_in_utc(tenants: Any) -> None:
    """A query error of one tenant's (its schema is missing) is not the database's: the index
    is still rebuilt, that tenant in UTC, instead of every rebuild failing for good."""
    from tests.testapp.tenants import QUERY_FAILS

    acme, globex = str(tenants[0].pk), str(tenants[1].pk)
    set_zones({acme: QUERY_FAILS.decode(), globex: "Asia/Tokyo"})
    refresh_tenant_zones()
    assert acme in list(tenants_in_zone("UTC"))
    assert globex in list(tenants_in_zone("Asia/Tokyo"))


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="statement_timeout is PostgreSQL's")
def test_a_tenants_query_cancelled_by_a_timeout_puts_that_tenant_in_utc(tenants: Any) -> None:
    """A timeout is an OperationalError too, but one tenant's query, not the database: the index
    is rebuilt, that tenant in UTC, rather than every rebuild given up while it times out."""
    from tests.testapp.tenants import QUERY_TIMES_OUT

    acme, globex = str(tenants[0].pk), str(tenants[1].pk)
    set_zones({acme: QUERY_TIMES_OUT.decode(), globex: "Asia/Tokyo"})
    refresh_tenant_zones()
    assert acme in list(tenants_in_zone("UTC"))
    assert globex in list(tenants_in_zone("Asia/Tokyo"))


def test_a_rebuild_that_outlived_its_lock_leaves_the_next_ones_alone(redis_client: Any) -> None:
    from kumiko_jobs.scheduling.zones import release_rebuild_lock, try_rebuild_lock

    keys = get_keys()
    assert try_rebuild_lock(redis_client, keys, "first")
    redis_client.delete(keys.tenant_zones_lock)  # expired while "first" was still rebuilding
    assert try_rebuild_lock(redis_client, keys, "second")
    release_rebuild_lock(redis_client, keys, "first")  # the late one ends
    assert not try_rebuild_lock(redis_client, keys, "third")  # "second" still holds it
    release_rebuild_lock(redis_client, keys, "second")
    assert try_rebuild_lock(redis_client, keys, "third")


def test_spread_gives_each_tenant_a_fixed_offset(declare: Any, make_leader: Any, tenants: Any) -> None:
    declare("t.spread", trigger=cron("0 3 * * *"), per_tenant=True, spread=600)
    leader = make_leader(utc(2025, 6, 1))
    leader.run_until(utc(2025, 6, 1, 4))
    drain(timeout=0.5)  # the wrapper runs; its children wait for their offsets

    children = JobRun.objects.filter(job_name="t.spread")
    offsets = sorted((c.next_attempt_at - c.queued_at).total_seconds() for c in children)  # type: ignore[operator]
    assert len(offsets) == len(tenants)
    assert all(0 <= offset < 600 for offset in offsets)
    assert len(set(offsets)) == len(offsets)  # spread, not all at once
    assert get_redis().zcard(get_keys().scheduled("worker")) == len(tenants)


def test_a_zone_wrapper_rebuilt_or_retried_from_its_record_keeps_its_zone(
    declare: Any, make_leader: Any, tenants: Any, traces: Any, redis_client: Any
) -> None:
    from kumiko_jobs.models import RunStatus
    from kumiko_jobs.rebuild import repush
    from kumiko_jobs.retrying import retry_failed

    set_zones({str(tenants[0].pk): "Asia/Tokyo", str(tenants[1].pk): "Asia/Tokyo"})
    refresh_tenant_zones()
    declare("t.morning", trigger=cron("0 7 * * *", tz="tenant"), per_tenant=True)
    leader = make_leader(utc(2025, 6, 1))
    leader.run_until(utc(2025, 6, 2))
    tokyo = JobRun.objects.get(job_name="_per_tenant:t.morning", zone="Asia/Tokyo")
    assert tokyo.scheduled_at is not None

    # Redis lost the wrapper before it ran: pushed again from its record, it reaches Tokyo only.
    redis_client.delete(get_keys().job(tokyo.job_id))
    assert repush(redis_client, [tokyo], admit=True) == 1
    drain()
    reached = sorted(
        t["tenant"] for t in traces("tick") if t["scheduled_at"] == tokyo.scheduled_at.isoformat()
    )
    assert reached == sorted([str(tenants[0].pk), str(tenants[1].pk)])

    # An operator's retry of a failed zone wrapper reaches the zone's tenants it missed, once.
    JobRun.objects.filter(pk=tokyo.pk).update(status=RunStatus.FAILED, finished_at=tokyo.queued_at)
    missed = JobRun.objects.get(job_name="t.morning", tenant_id=str(tenants[1].pk))
    missed.delete()  # as if the wrapper had failed before reaching this tenant
    redis_client.delete(get_keys().job(missed.job_id))
    tokyo.refresh_from_db()
    retry = retry_failed(tokyo)
    drain()

    again = [t["tenant"] for t in traces("tick") if t["scheduled_at"] == tokyo.scheduled_at.isoformat()]
    assert sorted(again) == sorted([str(tenants[0].pk), str(tenants[1].pk), str(tenants[1].pk)])
    assert JobRun.objects.get(pk=retry.run_id).zone == "Asia/Tokyo"


def test_two_rebuilds_at_once_keep_the_later_read_and_expire_the_other(
    tenants: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """refresh_tenant_zones() beside the leader's rebuild: the rebuild that read the tenants
    later wins even if it finishes first, and the other's generation does not stay forever."""
    from kumiko_jobs.scheduling import zones

    acme = str(tenants[0].pk)
    set_zones({acme: "Europe/Berlin"})
    refresh_tenant_zones()
    real_read = zones.zones_of_tenants
    slow: list[int] = []

    def read_then_let_another_rebuild(found: Any) -> dict[str, list[str]]:
        groups = real_read(found)  # the slow rebuild read Berlin
        if not slow:
            slow.append(1)
            set_zones({acme: "Asia/Tokyo"})  # the tenant moves, and the app refreshes at once
            refresh_tenant_zones()
        return groups

    monkeypatch.setattr(zones, "zones_of_tenants", read_then_let_another_rebuild)
    slow_index = zones.rebuild_zone_index()
    monkeypatch.undo()
    assert acme in list(tenants_in_zone("Asia/Tokyo"))  # not undone by the slower rebuild
    client, keys = get_redis(), get_keys()
    index = current_index(client, keys)
    assert index is not None and slow_index.generation == index.generation
    lost = index.generation - 1  # the slow rebuild's own: written, never installed
    assert 0 < client.ttl(keys.tenant_zones(lost)) <= zones.OLD_GENERATION_TTL
    assert 0 < client.ttl(keys.tenant_zone_members(lost, "Europe/Berlin")) <= zones.OLD_GENERATION_TTL
