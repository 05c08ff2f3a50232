"""Triggers as the catalog shows them, and a job's next cron fire time.

``next_fire_at`` computes with croniter in the trigger's zone. When the scheduler's own
next-tick computation (with its DST rules and per-tenant zones) is on this branch, this is the
one function to point at it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from kumiko_jobs.definitions import CronTrigger, EventTrigger, JobDefinition, ManualTrigger


def trigger_labels(definition: JobDefinition) -> list[str]:
    """``cron:<expr> <zone>``, ``event:<name>[ where ...]`` or ``manual``, one per trigger."""
    labels = []
    for trigger in definition.triggers:
        if isinstance(trigger, CronTrigger):
            labels.append(f"cron:{trigger.expr} {trigger.tz}")
        elif isinstance(trigger, EventTrigger):
            where = f" where {dict(trigger.where)}" if trigger.where else ""
            labels += [f"event:{name}{where}" for name in trigger.events]
        elif isinstance(trigger, ManualTrigger):
            labels.append("manual")
    return labels


def next_fire_at(definition: JobDefinition, now: datetime | None = None) -> datetime | None:
    """The earliest next tick (UTC) of the job's cron triggers; None without any. A trigger in
    tenants' local time (tz="tenant") is shown at its next UTC tick."""
    now = now or datetime.now(UTC)
    found = []
    for trigger in definition.triggers:
        if not isinstance(trigger, CronTrigger):
            continue
        try:
            zone = ZoneInfo(trigger.tz)
        except (ZoneInfoNotFoundError, ValueError):
            zone = ZoneInfo("UTC")
        try:
            seconds = len(trigger.expr.split()) == 6
            tick = croniter(trigger.expr, now.astimezone(zone), second_at_beginning=seconds).get_next(
                datetime
            )
        except (ValueError, KeyError):
            continue  # an invalid expression: the system checks report it
        found.append(tick.astimezone(UTC))
    return min(found, default=None)
