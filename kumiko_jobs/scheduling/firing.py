"""Fire cron ticks through the normal dispatch path, each at most once, under the leader's fence.

A tick's run row has a job id derived from (job, tick time) (specs.py), and the run table's
unique job id is the arbiter: the leader inserts the rows of the ticks it is about to push
(INSERT ... ON CONFLICT DO NOTHING RETURNING), unpushed (``pushed_at`` unset), and pushes those
it inserted. A row that already exists was either pushed (it is running, finished, or waiting in
Redis) or is still waiting for its push (its leader crashed or lost its lease in between): only
such a row is pushed again, ``unique`` (the outbox, rebuild.push_waiting, may push it too).
Whether a tick ran is never read from a Redis hash that expires.

The push itself is fenced (``push_watched`` on the lease key) and moves the schedules' cursors
in the same Redis transaction, so a tick is pushed and marked handled together, or neither.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
from redis.client import Pipeline

from kumiko_jobs import guarded_writes, records
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.dispatching import record_pushes
from kumiko_jobs.keys import Keys
from kumiko_jobs.preparing import prepare
from kumiko_jobs.pushing import PreparedJob, Selection, push_watched
from kumiko_jobs.registry import registry
from kumiko_jobs.scheduling.lease import LeaderLease
from kumiko_jobs.scheduling.specs import TICK_TRIGGER, Schedule, tick_job_id, zone_tick_job_id


@dataclass(frozen=True)
class Tick:
    schedule: Schedule
    at: float  # UTC epoch seconds
    zone: str  # the zone the tick was computed in (the wrapper's zone for tz="tenant")


# cursor key -> {zone: last tick handled}
CursorWrites = Mapping[str, Mapping[str, float]]


def prepare_tick(tick: Tick, keys: Keys) -> PreparedJob:
    definition = registry.get(tick.schedule.job_name)
    local = tick.schedule.tenant_local
    job_id = (
        zone_tick_job_id(keys, definition.name, tick.at, tick.zone)
        if local
        else tick_job_id(keys, definition.name, tick.at)
    )
    return prepare(
        definition,
        {},
        tenant_id=None,
        user_id=None,
        trigger_name=TICK_TRIGGER,
        job_id=job_id,
        unique=True,
        # The same id on every attempt, so the row and the Redis job always agree.
        run_id=uuid.uuid5(uuid.NAMESPACE_URL, job_id),
        # A zone wrapper's children derive their ids from the tick, not from the zone.
        fanout_of=tick_job_id(keys, definition.name, tick.at) if local else "",
        scheduled_at=tick.at,
        zone=tick.zone if local else "",
    )


def fire(
    ticks: Sequence[Tick],
    *,
    lease: LeaderLease,
    token: str,
    cursors: CursorWrites,
    client: redis.Redis | None = None,
) -> bool:
    """Enqueue ``ticks`` (those not enqueued before) and write ``cursors``; False, with nothing
    pushed, if ``token`` no longer holds the lease. Raises QueueUnavailable if Redis is down
    (recorded rows are then pushed by the next attempt)."""
    client = client or get_redis()
    keys = get_keys()
    prepared = [prepare_tick(tick, keys) for tick in ticks]
    for p in prepared:
        p.row.pushed_at = None  # recorded before the push: see the module docstring
    pending = _claim(prepared)

    def select(pipe: Pipeline) -> Selection | None:
        return pending if lease.holds(pipe, token) else None

    def write_cursors(pipe: Pipeline, _chosen: Selection) -> None:
        for key, values in cursors.items():
            if values:
                pipe.hset(key, mapping={zone: at for zone, at in values.items()})  # noqa: C416 (typing)

    result = push_watched(watch=lease.key, select=select, also=write_cursors, client=client)
    if result is None:
        return False
    pushed, outcomes = result
    # A "duplicate" is a tick another attempt pushed whose row we found unstarted: its row is right.
    kept = [(p, o) for p, o in zip(pushed, outcomes, strict=True) if o.status != "duplicate"]
    if kept:
        guarded_writes.safe(record_pushes, [p for p, _ in kept], [o for _, o in kept], rows_exist=True)
    guarded_writes.safe(records.mark_pushed, [p.row.id for p in pushed], now=datetime.now(UTC))
    return True


def _claim(prepared: Sequence[PreparedJob]) -> list[PreparedJob]:
    """The ticks this leader must push: rows it inserted, and rows left unpushed by an attempt
    that recorded them and then crashed or lost its lease."""
    if not prepared:
        return []
    inserted = records.insert_claiming([p.row for p in prepared])
    others = {p.job_id for p in prepared} - inserted
    adopted = records.unpushed(others) if others else set()
    return [p for p in prepared if p.job_id in inserted or p.job_id in adopted]
