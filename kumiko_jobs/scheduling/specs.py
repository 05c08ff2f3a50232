"""What a schedule is (a job's cron trigger), which a lane declares, and how its ticks are named.

A tick is identified by (job, scheduled UTC time): its job id is derived from both, so every
process and every leader names the same tick the same way, and the run table's unique job id
decides whether it was enqueued (see firing.py). A tz="tenant" schedule fires one wrapper per
time zone in use; the wrapper's id adds the zone, its children's ids do not (a tenant that moves
between two zones with the same tick time is still enqueued once).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kumiko_jobs.definitions import TENANT_ZONE, CronTrigger, EventTrigger, JobDefinition, Trigger
from kumiko_jobs.keys import Keys
from kumiko_jobs.registry import registry

TICK_TRIGGER = "cron"  # the trigger_name of every run a schedule fires


@dataclass(frozen=True)
class Schedule:
    job_name: str
    lane: str
    expr: str
    tz: str  # an IANA zone, or TENANT_ZONE

    @property
    def id(self) -> str:
        """Stable across processes and deploys while the declaration is unchanged."""
        return f"{self.job_name}|{self.expr}|{self.tz}"

    @property
    def tenant_local(self) -> bool:
        return self.tz == TENANT_ZONE


def schedules_of(definition: JobDefinition) -> list[Schedule]:
    seen: dict[tuple[str, str], Schedule] = {}
    for trigger in definition.triggers:
        if isinstance(trigger, CronTrigger):
            seen.setdefault(
                (trigger.expr, trigger.tz),
                Schedule(definition.name, definition.lane, trigger.expr, trigger.tz),
            )
    return list(seen.values())


def lane_schedules(lane: str) -> list[Schedule]:
    """The schedules this process declares for ``lane``, in declaration order."""
    return [s for d in registry.all() if d.lane == lane for s in schedules_of(d)]


def _digest(text: str, size: int) -> str:
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:size]


def tick_job_id(keys: Keys, job_name: str, at: float) -> str:
    """The job id of ``job_name``'s tick at ``at`` (UTC epoch seconds)."""
    return f"{keys.id_tag}-cron-{_digest(job_name, 10)}-{int(at)}"


def zone_tick_job_id(keys: Keys, job_name: str, at: float, zone: str) -> str:
    """The job id of a tz="tenant" tick's wrapper for the tenants in ``zone``."""
    return f"{tick_job_id(keys, job_name, at)}-z{_digest(zone, 6)}"


def trigger_labels(trigger: Trigger) -> list[str]:
    """How ``jobs list`` names a trigger: ``cron:0 7 * * * Europe/Berlin``, ``event:a.b``, ``manual``."""
    if isinstance(trigger, CronTrigger):
        return [f"cron:{trigger.expr} {trigger.tz}"]
    if isinstance(trigger, EventTrigger):
        where = "".join(f" {key}={value!r}" for key, value in sorted((trigger.where or {}).items()))
        return [f"event:{event}{where}" for event in trigger.events]
    return ["manual"]
