"""Cron arithmetic in a zone: DST gaps fire once at the jump, repeated times fire once."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kumiko_jobs.scheduling.cronmath import next_tick, ticks_between


def utc(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()  # type: ignore[arg-type]


def iso(instants: list[float]) -> list[str]:
    return [datetime.fromtimestamp(t, UTC).strftime("%m-%d %H:%M:%S") for t in instants]


def test_nonexistent_local_time_fires_once_when_the_clocks_jump() -> None:
    # Berlin, 2025-03-30: 02:00 CET jumps to 03:00 CEST (01:00 UTC); 02:30 does not exist.
    ticks = list(ticks_between("30 2 * * *", "Europe/Berlin", utc(2025, 3, 28), utc(2025, 4, 1)))

    assert iso(ticks) == ["03-28 01:30:00", "03-29 01:30:00", "03-30 01:00:00", "03-31 00:30:00"]


def test_repeated_local_time_fires_once_at_its_first_occurrence() -> None:
    # Berlin, 2025-10-26: 03:00 CEST falls back to 02:00 CET; 02:30 happens at 00:30 and 01:30 UTC.
    ticks = list(ticks_between("30 2 * * *", "Europe/Berlin", utc(2025, 10, 24), utc(2025, 10, 28)))

    assert iso(ticks) == ["10-24 00:30:00", "10-25 00:30:00", "10-26 00:30:00", "10-27 01:30:00"]


def test_a_skipped_hour_of_a_minutely_schedule_is_one_tick() -> None:
    ticks = list(
        ticks_between("*/20 * * * *", "Europe/Berlin", utc(2025, 3, 30, 0, 30), utc(2025, 3, 30, 1, 30))
    )

    # 01:40 CET, then 02:00/02:20/02:40 (nonexistent) all at the jump, 03:20 CEST.
    assert iso(ticks) == ["03-30 00:40:00", "03-30 01:00:00", "03-30 01:20:00"]


def test_starting_inside_the_repeated_hour_skips_its_second_pass() -> None:
    # 01:10 UTC is 02:10 CET, the second 02:10 of the night; 02:30 CET is a repeat: not fired.
    ticks = list(
        ticks_between("*/30 * * * *", "Europe/Berlin", utc(2025, 10, 26, 1, 10), utc(2025, 10, 26, 2, 10))
    )

    assert iso(ticks) == ["10-26 02:00:00"]


def test_seconds_field_and_bounds() -> None:
    start = utc(2025, 1, 1, 12)
    assert iso(list(ticks_between("* * * * * *", "UTC", start, start + 3))) == [
        "01-01 12:00:01",
        "01-01 12:00:02",
        "01-01 12:00:03",
    ]
    # (after, until]: a tick exactly at ``after`` belongs to the previous window.
    assert next_tick("0 * * * *", "UTC", utc(2025, 1, 1, 12)) == utc(2025, 1, 1, 13)
    assert next_tick("0 * * * *", "UTC", utc(2025, 1, 1, 12) + 0.5) == utc(2025, 1, 1, 13)


@pytest.mark.parametrize(
    ("zone", "expected"),
    [
        # New York springs forward on 2025-03-09: 02:00 EST does not exist, 03:00 EDT is 07:00 UTC.
        ("America/New_York", "03-09 07:00:00"),
        # Tokyo has no DST: 02:00 JST on 03-10 is 17:00 UTC on 03-09.
        ("Asia/Tokyo", "03-09 17:00:00"),
    ],
)
def test_other_zones(zone: str, expected: str) -> None:
    tick = next_tick("0 2 * * *", zone, utc(2025, 3, 9))
    assert tick is not None
    assert iso([tick]) == [expected]


def test_a_date_that_never_comes_has_no_tick() -> None:
    assert next_tick("0 0 31 2 *", "UTC", utc(2025, 1, 1)) is None
