"""A tick is enqueued at most once: the run table arbitrates, the lease fences, gates apply."""

from __future__ import annotations

from typing import Any

import pytest

from kumiko_jobs import cron
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.scheduling.specs import Schedule, tick_job_id
from kumiko_jobs.testing import drain
from tests.scheduling.conftest import utc

pytestmark = pytest.mark.django_db(transaction=True)
START = utc(2025, 1, 1, 12, 0, 30)


def test_a_leader_that_lost_its_lease_pushes_nothing(
    declare: Any, make_leader: Any, redis_client: Any, traces: Any
) -> None:
    declare("t.minutely", trigger=cron("* * * * *"))
    stale = make_leader(START, owner="a")
    # The lease expires while "a" is paused; "b" takes it.
    redis_client.delete(stale.lease.key)
    fresh = make_leader(START, owner="b")

    stale.clock.t = START + 60
    assert stale.planner.step(stale.token) is None  # fenced: nothing pushed

    tick_id = tick_job_id(get_keys(), "t.minutely", utc(2025, 1, 1, 12, 1))
    assert not redis_client.exists(get_keys().job(tick_id))
    # "a" had recorded the tick before its push was refused: the new leader pushes that row.
    waiting = JobRun.objects.get(job_id=tick_id)
    assert (waiting.status, waiting.pushed_at) == (RunStatus.QUEUED, None)
    fresh.run_until(START + 60)
    drain()

    assert [t["job_id"] for t in traces("tick")] == [tick_id]
    done = JobRun.objects.get(job_id=tick_id)
    assert done.status == RunStatus.SUCCEEDED and done.pushed_at is not None
    assert done.scheduled_at is not None and done.scheduled_at.timestamp() == utc(2025, 1, 1, 12, 1)


def test_dedup_does_not_depend_on_redis_retention(
    declare: Any, make_leader: Any, redis_client: Any, traces: Any
) -> None:
    declare("t.minutely", trigger=cron("* * * * *"))
    leader = make_leader(START)
    leader.run_until(START + 60)
    drain()
    tick_id = tick_job_id(get_keys(), "t.minutely", utc(2025, 1, 1, 12, 1))
    leader.lease.release(leader.token)

    # Long after: the finished job's hash has expired (RESULT_TTL) and, worse, the schedule's
    # cursor was rewound (a Redis restored from an old snapshot). The run row still decides.
    redis_client.delete(get_keys().job(tick_id))
    schedule = Schedule("t.minutely", "worker", "* * * * *", "UTC")
    redis_client.hset(get_keys().schedule_cursor("worker", schedule.id), "UTC", START)
    again = make_leader(START + 70, owner="b")
    again.run_until(START + 70)
    drain()

    assert [t["job_id"] for t in traces("tick")] == [tick_id]


def test_ticks_pass_the_jobs_gates(declare: Any, make_leader: Any) -> None:
    declare("t.skipping", trigger=cron("* * * * *"), concurrency="skip")
    leader = make_leader(START)

    leader.run_until(START + 120)  # two ticks, no worker: the second finds the first queued

    first, second = JobRun.objects.filter(job_name="t.skipping").order_by("queued_at")
    assert first.status == RunStatus.QUEUED
    assert second.status == RunStatus.DROPPED
    assert "concurrency" in second.error


def test_a_per_tenant_tick_fans_out_once_per_tenant(
    declare: Any, make_leader: Any, tenants: Any, traces: Any
) -> None:
    declare("t.nightly", trigger=cron("0 3 * * *", tz="Europe/Berlin"), per_tenant=True)
    leader = make_leader(utc(2025, 6, 1))

    leader.run_until(utc(2025, 6, 2))
    drain()

    ticks = traces("tick")
    assert sorted(t["tenant"] for t in ticks) == sorted(str(t.pk) for t in tenants)
    assert {t["scheduled_at"] for t in ticks} == {"2025-06-01T01:00:00+00:00"}
    wrapper = JobRun.objects.get(job_name="_per_tenant:t.nightly")
    assert (wrapper.trigger_name, wrapper.fanout_count) == ("cron", len(tenants))
