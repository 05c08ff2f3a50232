"""The catalog of declared jobs: lane, triggers, next fire time (with the scheduler's DST and
tenant-zone rules) and last success. ``manage.py jobs list`` prints it, the admin console's job
catalog shows it; this module needs neither (no rich, no admin)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.definitions import TENANT_ZONE, CronTrigger, JobDefinition
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.registry import registry
from kumiko_jobs.scheduling import zones
from kumiko_jobs.scheduling.cronmath import as_utc, next_tick
from kumiko_jobs.scheduling.cronmath import zone as zone_info
from kumiko_jobs.scheduling.specs import trigger_labels
from kumiko_jobs.tenancy import active_tenant_ids

logger = logging.getLogger("kumiko_jobs")


@dataclass(frozen=True)
class NextFire:
    at: float  # UTC epoch seconds
    zone: str  # the zone the tick is computed in

    @property
    def utc(self) -> datetime:
        return as_utc(self.at)

    @property
    def local(self) -> datetime:
        return self.utc.astimezone(zone_info(self.zone))


@dataclass(frozen=True)
class JobInfo:
    definition: JobDefinition
    next_fire: NextFire | None
    last_success_at: datetime | None

    def as_json(self) -> dict[str, Any]:
        d = self.definition
        return {
            "name": d.name,
            "lane": d.lane,
            "triggers": [label for trigger in d.triggers for label in trigger_labels(trigger)],
            "next_fire_at": self.next_fire.utc.isoformat() if self.next_fire else None,
            "last_success_at": self.last_success_at.isoformat() if self.last_success_at else None,
        }


def job_catalog(now: float | None = None) -> list[JobInfo]:
    """The catalog of declared jobs, sorted by name."""
    now = time.time() if now is None else now
    tenant_zones: list[str] | None = None
    infos = []
    for d in sorted(registry.all(), key=lambda d: d.name):
        crons = [t for t in d.triggers if isinstance(t, CronTrigger)]
        if tenant_zones is None and any(t.tz == TENANT_ZONE for t in crons):
            tenant_zones = zones_in_use()
        infos.append(JobInfo(d, next_fire(crons, now, tenant_zones or []), last_success(d.name)))
    return infos


def next_fire(crons: list[CronTrigger], now: float, tenant_zones: list[str]) -> NextFire | None:
    """The earliest next tick of these triggers; a tz="tenant" one over the zones in use."""
    found: list[NextFire] = []
    for trigger in crons:
        for name in tenant_zones if trigger.tz == TENANT_ZONE else [trigger.tz]:
            at = next_tick(trigger.expr, name, now)
            if at is not None:
                found.append(NextFire(at, name))
    return min(found, key=lambda f: f.at, default=None)


def zones_in_use() -> list[str]:
    """The tenant zones of the installed index; without one, read them (O(tenants), once)."""
    index = zones.current_index(get_redis(), get_keys())
    if index is not None:
        return sorted(index.zones)
    try:
        return sorted(zones.zones_of_tenants(active_tenant_ids()))
    except Exception as exc:  # the user's tenant source: report, do not crash the listing
        logger.warning("kumiko_jobs: could not read the tenants' zones (%s); showing UTC", exc)
        return [zones.DEFAULT_ZONE]


def last_success(job_name: str) -> datetime | None:
    # Newest succeeded run by queue time: an index range scan (kj_run_job_status) instead of a
    # MAX(finished_at) over every succeeded run of the job. Of this deployment (QUEUE_PREFIX):
    # every job id it makes starts with its id tag, and a database may be shared by several.
    return (
        JobRun.objects.filter(
            job_name=job_name, status=RunStatus.SUCCEEDED, job_id__startswith=f"{get_keys().id_tag}-"
        )
        .order_by("-queued_at")
        .values_list("finished_at", flat=True)
        .first()
    )
