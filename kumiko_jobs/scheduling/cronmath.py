"""Which UTC instants a cron expression names in a time zone, with the contract's DST rules.

croniter walks local wall-clock times (naive datetimes, so it knows nothing of DST); each wall
time is then mapped to one instant. A wall time that does not exist that day (spring forward)
fires once at the first valid instant after it, the moment the clocks jump; one that occurs
twice (fall back) fires once, at its first occurrence. Wall times that map to the same instant
(a skipped hour of a per-minute schedule) make one tick. A consequence worth knowing: a
schedule with a wildcard hour in a DST zone has no ticks during the repeated hour; schedules
that are intervals rather than wall-clock times belong in UTC.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import cache
from zoneinfo import ZoneInfo

from croniter import croniter
from croniter.croniter import CroniterBadDateError


@cache
def zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def has_seconds(expr: str) -> bool:
    return len(expr.split()) == 6


def instant_of(wall: datetime, tz: ZoneInfo) -> float:
    """The UTC instant (epoch seconds) at which naive local time ``wall`` fires in ``tz``."""
    first = wall.replace(tzinfo=tz, fold=0)  # fold=0: an ambiguous time's first occurrence
    instant = first.timestamp()
    if datetime.fromtimestamp(instant, tz).replace(tzinfo=None) == wall:
        return instant
    return _end_of_gap(wall, tz)


def _end_of_gap(wall: datetime, tz: ZoneInfo) -> float:
    """The instant the clocks jump past a nonexistent ``wall``. fold=0 reads a gap time with the
    offset before the jump (an instant after it), fold=1 with the offset after (an instant
    before it): the jump lies between, found by bisection to the second."""
    lo = math.floor(wall.replace(tzinfo=tz, fold=1).timestamp())
    hi = math.ceil(wall.replace(tzinfo=tz, fold=0).timestamp())
    after = datetime.fromtimestamp(hi, tz).utcoffset()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, tz).utcoffset() == after:
            hi = mid
        else:
            lo = mid
    return float(hi)


def ticks_between(expr: str, tz_name: str, after: float, until: float) -> Iterator[float]:
    """The instants of ``expr`` in ``tz_name`` in ``(after, until]``, ascending, each once."""
    tz = zone(tz_name)
    start = datetime.fromtimestamp(math.floor(after), tz).replace(tzinfo=None)
    walls = croniter(expr, start, ret_type=datetime, second_at_beginning=has_seconds(expr))
    last = after
    while True:
        try:
            wall = walls.get_next(datetime)
        except CroniterBadDateError:  # e.g. "0 0 31 2 *": no such date
            return
        instant = instant_of(wall, tz)
        if instant > until:
            return
        if instant > last:
            last = instant
            yield instant


def next_tick(expr: str, tz_name: str, after: float) -> float | None:
    """The first instant of ``expr`` in ``tz_name`` after ``after``; None if there is none."""
    return next(ticks_between(expr, tz_name, after, math.inf), None)


def as_utc(instant: float) -> datetime:
    return datetime.fromtimestamp(instant, UTC)
