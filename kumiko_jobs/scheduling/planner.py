"""The leader's plan: for each (schedule, zone), the last tick handled and the next one due.

Work per loop is O(schedules x zones in use): a comparison per entry, and cron arithmetic only
for entries that are due. A cursor (the last tick handled, fired or skipped) per entry lives in
Redis and moves in the same transaction as the push of its ticks, so a new leader resumes where
the last one stopped. Ticks it finds overdue are fired late if younger than CRON_CATCH_UP
seconds, older ones are skipped and logged with their count; an entry without a cursor (a
schedule or zone seen for the first time) starts from now and never fires the past.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis

from kumiko_jobs.conf import get_config
from kumiko_jobs.keys import Keys
from kumiko_jobs.scheduling import firing, zones
from kumiko_jobs.scheduling.cronmath import next_tick, ticks_between
from kumiko_jobs.scheduling.lease import LeaderLease
from kumiko_jobs.scheduling.specs import Schedule

logger = logging.getLogger("kumiko_jobs")
# Skipped ticks are counted for the log up to this many (an every-second schedule idle for a
# week would otherwise cost the new leader a walk over 600,000 ticks). All entries are walked in
# one step, inside the leader's 10 s lease: at 100,000 a handful of 6-field or tz="tenant"
# entries took longer than the lease after a long outage, so every leader lost it before its
# push and the cursors never moved again.
SKIP_COUNT_LIMIT = 1_000
# And for this many seconds in all, per step: the walk is per entry, and a tz="tenant" schedule
# is one entry per zone in use (a review measured 14-31 ms per 1,000 ticks: 300 entries after a
# 17-hour outage walked past the lease again). Entries counted after it say "at least".
SKIP_COUNT_BUDGET = 1.0
IDLE_WAIT = 1.0


@dataclass
class Entry:
    schedule: Schedule
    zone: str
    cursor: float
    next_at: float | None

    def advance(self, handled: float) -> None:
        self.cursor = handled
        self.next_at = next_tick(self.schedule.expr, self.zone, handled)


class Planner:
    def __init__(
        self,
        schedules: Sequence[Schedule],
        *,
        lease: LeaderLease,
        client: redis.Redis,
        keys: Keys,
        clock: Callable[[], float],
    ) -> None:
        self.lane_schedules = list(schedules)
        self.lease, self.client, self.keys, self.clock = lease, client, keys, clock
        self.entries: dict[tuple[str, str], Entry] = {}
        self.zone_generation: int | None = None

    def _cursor_key(self, schedule: Schedule) -> str:
        return self.keys.schedule_cursor(schedule.lane, schedule.id)

    def load(self, token: str) -> bool:
        """Become the planner of a new tenure: read every cursor; start new entries from now."""
        self.entries = {}
        self.zone_generation = None
        fixed = [s for s in self.lane_schedules if not s.tenant_local]
        return self._add_entries(token, [(s, s.tz) for s in fixed]) and self.sync_zones(token)

    def sync_zones(self, token: str) -> bool:
        """Follow the tenant zone index: an entry per zone in use for each tz="tenant" schedule."""
        local = [s for s in self.lane_schedules if s.tenant_local]
        if not local:
            return True
        found = zones.current_generation(self.client, self.keys)
        if found is None or found[0] == self.zone_generation:
            return True
        index = zones.current_index(self.client, self.keys)
        in_use = set(index.zones) if index else set()
        gone = [k for k in self.entries if k[0] in {s.id for s in local} and k[1] not in in_use]
        for key in gone:
            # Forget the zone's cursor too: if tenants come back to it, it starts from now.
            entry = self.entries.pop(key)
            self.client.hdel(self._cursor_key(entry.schedule), entry.zone)
        wanted = [(s, z) for s in local for z in sorted(in_use) if (s.id, z) not in self.entries]
        if not self._add_entries(token, wanted):
            return False
        self.zone_generation = found[0]
        return True

    def _add_entries(self, token: str, wanted: list[tuple[Schedule, str]]) -> bool:
        if not wanted:
            return True
        pipe = self.client.pipeline(transaction=False)
        for schedule, zone in wanted:
            pipe.hget(self._cursor_key(schedule), zone)
        stored = pipe.execute()
        now = self.clock()
        fresh: dict[str, dict[str, float]] = {}
        for (schedule, zone), raw in zip(wanted, stored, strict=True):
            cursor = float(raw) if raw is not None else now
            if raw is None:
                fresh.setdefault(self._cursor_key(schedule), {})[zone] = now
            entry = Entry(schedule, zone, cursor, None)
            entry.advance(cursor)
            self.entries[(schedule.id, zone)] = entry
        if fresh:
            return firing.fire([], lease=self.lease, token=token, cursors=fresh, client=self.client)
        return True

    def step(self, token: str) -> float | None:
        """Fire what is due; seconds until the next entry is due, or None if the lease is lost."""
        now = self.clock()
        due = [e for e in self.entries.values() if e.next_at is not None and e.next_at <= now]
        if due:
            catch_up = float(get_config()["CRON_CATCH_UP"])
            ticks: list[firing.Tick] = []
            cursors: dict[str, dict[str, float]] = {}
            handled: list[tuple[Entry, float]] = []
            counting_until = time.monotonic() + SKIP_COUNT_BUDGET
            for entry in due:
                fired, last = self._collect(entry, now, catch_up, counting_until)
                ticks += fired
                cursors.setdefault(self._cursor_key(entry.schedule), {})[entry.zone] = last
                handled.append((entry, last))
            if not firing.fire(ticks, lease=self.lease, token=token, cursors=cursors, client=self.client):
                return None
            for entry, last in handled:
                entry.advance(last)
        pending = [e.next_at for e in self.entries.values() if e.next_at is not None]
        return max(0.0, min(pending) - self.clock()) if pending else IDLE_WAIT

    def _collect(
        self, entry: Entry, now: float, catch_up: float, counting_until: float
    ) -> tuple[list[firing.Tick], float]:
        """The ticks of ``entry`` to fire now, and the last tick handled (skipped ticks counted
        for the log until ``counting_until``, on the monotonic clock)."""
        expr, zone = entry.schedule.expr, entry.zone
        oldest = now - catch_up
        start, skipped, cut = entry.cursor, 0, False
        if entry.next_at is not None and entry.next_at < oldest:
            for skipped, _ in enumerate(ticks_between(expr, zone, entry.cursor, oldest), start=1):
                if skipped >= SKIP_COUNT_LIMIT or time.monotonic() > counting_until:
                    cut = True
                    break
            start = oldest
            logger.warning(
                "kumiko_jobs: schedule %s (%s): skipped %s%d tick(s) older than CRON_CATCH_UP (%gs): "
                "no leader ran when they were due.",
                entry.schedule.job_name,
                zone,
                "at least " if cut else "",
                skipped,
                catch_up,
            )
        fired = [firing.Tick(entry.schedule, at, zone) for at in ticks_between(expr, zone, start, now)]
        return fired, fired[-1].at if fired else start
