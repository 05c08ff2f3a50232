"""Schedules are stamped by live processes; orphans go after the grace, never before."""

from __future__ import annotations

from typing import Any

from kumiko_jobs.connection import get_keys
from kumiko_jobs.scheduling.registration import registered_schedules, remove_orphans, stamp_declared
from kumiko_jobs.scheduling.specs import Schedule

OLD = Schedule("t.old", "worker", "0 0 1 1 *", "UTC")
NEW = Schedule("t.new", "worker", "0 7 * * *", "Europe/Berlin")


def test_orphans_are_removed_after_the_grace_not_before(redis_client: Any) -> None:
    keys = get_keys()
    stamp_declared(redis_client, keys, "worker", [OLD, NEW], now=1000)
    stamp_declared(redis_client, keys, "worker", [NEW], now=1500)  # only the new deploy runs

    assert remove_orphans(redis_client, keys, "worker", now=1599, grace=600) == []
    assert remove_orphans(redis_client, keys, "worker", now=1601, grace=600) == [OLD.id]

    assert registered_schedules(redis_client, keys, "worker") == {NEW.id: 1500}
    assert not redis_client.exists(keys.schedule_cursor("worker", OLD.id))
    assert redis_client.hget(keys.schedule_cursor("worker", NEW.id), "Europe/Berlin") == b"1000"


def test_a_rolling_deploy_keeps_both_versions_schedules(redis_client: Any) -> None:
    keys = get_keys()
    for now in (1000, 1300, 1600, 1900):  # old and new processes stamp side by side
        stamp_declared(redis_client, keys, "worker", [OLD], now=now)
        stamp_declared(redis_client, keys, "worker", [NEW], now=now)

    assert remove_orphans(redis_client, keys, "worker", now=2000, grace=600) == []
    assert set(registered_schedules(redis_client, keys, "worker")) == {OLD.id, NEW.id}
