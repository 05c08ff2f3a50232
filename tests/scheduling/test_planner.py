"""The leader's planner with an injected clock: DST, catch-up, first sight, one run per tick."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from croniter import croniter

from kumiko_jobs import cron
from kumiko_jobs.models import JobRun
from kumiko_jobs.testing import drain
from tests.scheduling.conftest import utc

pytestmark = pytest.mark.django_db(transaction=True)


def fired_at(traces: Any, job: str | None = None) -> list[str]:
    return sorted(
        datetime.fromisoformat(t["scheduled_at"]).strftime("%m-%d %H:%M")
        for t in traces("tick")
        if job is None or t["job"] == job
    )


def test_berlin_job_across_spring_forward(declare: Any, make_leader: Any, traces: Any) -> None:
    declare("t.berlin", trigger=cron("30 2 * * *", tz="Europe/Berlin"))
    leader = make_leader(utc(2025, 3, 28, 12))

    leader.run_until(utc(2025, 4, 1, 12))
    drain()

    # 02:30 does not exist on 03-30: fired once at 03:00 CEST (01:00 UTC), the moment of the jump.
    assert fired_at(traces) == ["03-29 01:30", "03-30 01:00", "03-31 00:30", "04-01 00:30"]


def test_berlin_job_across_fall_back(declare: Any, make_leader: Any, traces: Any) -> None:
    declare("t.berlin", trigger=cron("30 2 * * *", tz="Europe/Berlin"))
    declare("t.berlin_hourly", trigger=cron("15 * * * *", tz="Europe/Berlin"))
    leader = make_leader(utc(2025, 10, 25, 22))

    leader.run_until(utc(2025, 10, 26, 4), step=30)
    drain()

    # 02:30 happens twice on 10-26 (00:30 and 01:30 UTC): fired once, at the first.
    assert fired_at(traces, "t.berlin") == ["10-26 00:30"]
    # Hourly at :15 local: 02:15 CEST fires, the repeated 02:15 CET does not.
    assert fired_at(traces, "t.berlin_hourly") == [
        "10-25 22:15",
        "10-25 23:15",
        "10-26 00:15",
        "10-26 02:15",
        "10-26 03:15",
    ]
    runs = JobRun.objects.filter(job_name="t.berlin")
    assert [(r.trigger_name, r.triggered_by, r.status) for r in runs] == [("cron", None, "succeeded")]


def test_scheduled_at_is_the_aware_utc_tick(declare: Any, make_leader: Any, traces: Any) -> None:
    declare("t.minutely", trigger=cron("* * * * *"))
    leader = make_leader(utc(2025, 1, 1, 12, 0, 30))

    leader.run_until(utc(2025, 1, 1, 12, 1, 10), step=5)
    drain()

    [tick] = traces("tick")
    assert tick["scheduled_at"] == datetime(2025, 1, 1, 12, 1, tzinfo=UTC).isoformat()
    assert (tick["trigger"], tick["user"]) == ("cron", None)


def test_a_schedule_seen_first_starts_from_now(declare: Any, make_leader: Any, traces: Any) -> None:
    declare("t.minutely", trigger=cron("* * * * *"))
    leader = make_leader(utc(2025, 1, 1, 12, 0, 30))

    leader.run_until(utc(2025, 1, 1, 12, 0, 59), step=1)
    drain()

    assert traces("tick") == []  # 12:00 and every earlier minute are in the past: never fired


def test_missed_ticks_are_caught_up_within_the_window_and_older_ones_skipped(
    declare: Any, make_leader: Any, traces: Any, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "CRON_CATCH_UP": 300}
    declare("t.minutely", trigger=cron("* * * * *"))
    start = utc(2025, 1, 1, 12, 0, 30)
    leader = make_leader(start)

    # No leader ran for 15 minutes: 12:01..12:15 fell due; the window keeps 12:10:30..12:15:30.
    leader.clock.t = start + 15 * 60
    with caplog.at_level(logging.WARNING, logger="kumiko_jobs"):
        assert leader.planner.step(leader.token) is not None
    drain()

    assert fired_at(traces) == [f"01-01 12:{m:02d}" for m in range(11, 16)]
    assert "skipped 10 tick(s) older than CRON_CATCH_UP (300s)" in caplog.text


def test_skipped_count_matches_croniter(
    declare: Any, make_leader: Any, caplog: pytest.LogCaptureFixture
) -> None:
    declare("t.every_second", trigger=cron("*/7 * * * * *"))
    start = utc(2025, 1, 1, 12)
    leader = make_leader(start)
    leader.clock.t = start + 3600
    with caplog.at_level(logging.WARNING, logger="kumiko_jobs"):
        leader.planner.step(leader.token)

    it = croniter("*/7 * * * * *", datetime(2025, 1, 1, 12), second_at_beginning=True)
    expected = 0
    while it.get_next(float) <= start + 3600 - 600:
        expected += 1
    assert f"skipped {expected} tick(s)" in caplog.text


def test_a_long_outage_costs_the_new_leader_a_bounded_walk(
    declare: Any, make_leader: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two days without a leader under six every-second schedules: the skipped ticks are counted
    up to SKIP_COUNT_LIMIT each, so the step ends well inside the lease and fires (a walk of
    100,000 ticks per entry outlasted the lease: every leader lost it, and no cursor moved)."""
    from kumiko_jobs.scheduling import planner
    from kumiko_jobs.scheduling.planner import SKIP_COUNT_LIMIT

    monkeypatch.setattr(planner, "SKIP_COUNT_BUDGET", float("inf"))  # the limit alone, however slow
    _first_step_after_two_days_of_six_every_second_schedules(declare, make_leader, caplog)
    assert caplog.text.count(f"skipped at least {SKIP_COUNT_LIMIT} tick(s)") == 6


def _first_step_after_two_days_of_six_every_second_schedules(
    declare: Any, make_leader: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A new leader's first step after two days without one, under six every-second schedules;
    it must fire (the lease held), its warnings in ``caplog``."""
    for n in range(6):
        declare(f"t.second_{n}", trigger=cron("* * * * * *"))
    start = utc(2025, 1, 1, 12)
    leader = make_leader(start)
    leader.clock.t = start + 2 * 86400
    with caplog.at_level(logging.WARNING, logger="kumiko_jobs"):
        assert leader.planner.step(leader.token) is not None  # fired: the lease held


def test_skipped_ticks_are_counted_within_one_budget_for_every_entry(
    declare: Any, make_leader: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count is per entry, and a tz="tenant" schedule is one entry per zone: hundreds of
    entries counting 1,000 ticks each outlasted the lease again. One budget covers them all."""
    from kumiko_jobs.scheduling import planner

    monkeypatch.setattr(planner, "SKIP_COUNT_BUDGET", 0.0)  # spent before the first entry
    _first_step_after_two_days_of_six_every_second_schedules(declare, make_leader, caplog)
    assert caplog.text.count("skipped at least 1 tick(s)") == 6


def test_one_counting_budget_is_shared_by_every_entry(
    declare: Any, make_leader: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clock that moves 1 ms each time the planner reads it, and a 0.5 s budget: the six
    entries count about 500 ticks together, not 500 each (a budget per entry: ~3,000)."""
    from kumiko_jobs.scheduling import planner

    class Clock:
        now = 0.0

        def monotonic(self) -> float:
            self.now += 0.001
            return self.now

    monkeypatch.setattr(planner, "SKIP_COUNT_BUDGET", 0.5)
    monkeypatch.setattr(planner, "time", Clock())
    _first_step_after_two_days_of_six_every_second_schedules(declare, make_leader, caplog)
    counted = [int(n) for n in re.findall(r"skipped at least (\d+) tick", caplog.text)]
    assert len(counted) == 6
    assert sum(counted) <= 510


def test_each_tick_runs_once_across_leader_changes(declare: Any, make_leader: Any, traces: Any) -> None:
    declare("t.minutely", trigger=cron("* * * * *"))
    first = make_leader(utc(2025, 1, 1, 12, 0, 30), owner="a")
    first.run_until(utc(2025, 1, 1, 12, 5, 30))
    first.lease.release(first.token)

    # A second leader (a restart, or another process) resumes from the stored cursor and fires
    # the ticks missed meanwhile (12:06..12:08, late), then the rest on time.
    second = make_leader(utc(2025, 1, 1, 12, 8, 30), owner="b")
    second.run_until(utc(2025, 1, 1, 12, 10, 30))
    drain()

    assert fired_at(traces) == [f"01-01 12:{m:02d}" for m in range(1, 11)]
    assert JobRun.objects.filter(job_name="t.minutely").count() == 10


def test_a_leader_whose_planner_fails_to_load_gives_the_lease_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Held with no token kept, the lease left the lane without a leader until it expired."""
    from kumiko_jobs.scheduling.loop import SchedulerThread

    thread = SchedulerThread("worker", "loads-badly")

    def fails(token: str) -> bool:
        raise RuntimeError("a schedule's state could not be read")

    monkeypatch.setattr(thread.planner, "load", fails)
    with pytest.raises(RuntimeError):
        thread._iteration()
    assert thread.lease.holder() is None  # another process may lead at once
    monkeypatch.undo()
    thread._next["lease"] = 0.0
    thread._iteration()
    assert thread.token is not None and thread.lease.holder() == thread.token
    thread.lease.release(thread.token)
