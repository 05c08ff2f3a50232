"""The scheduler leader's cost per tick of a tz="tenant" schedule with 10,000 tenants in 30 zones.

In this process, on the bench's Redis and database: ACTIVE_TENANTS returns "0".."N-1"
(bench.benchapp.tenants), TENANT_TIMEZONE puts tenant i in ZONES[i % 30]; the zone index is
built once (timed: that is the O(tenants) part, done every TENANT_ZONE_REFRESH seconds, never
per tick). A per-tenant job on ``cron("* * * * *", tz="tenant")`` is declared in an isolated
registry (never in the bench jobs module, so no bench worker fires it), and the real planner,
lease and firing path run under an injected clock that jumps from minute to minute: at every
minute all 30 zones are due, so each measured step records and pushes 30 zone wrappers. The
figure is the wall time of one step (the leader's whole work for that tick); the wrappers'
fan-out to the tenants is workers' work and not part of it.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

from rich.console import Console

from bench.benchapp.tenants import FANOUT_TENANTS_ENV
from bench.environment import BenchEnv, delete_own_keys, delete_own_rows
from bench.results import Figure

# 30 zones in use, with whole-hour and half-hour offsets.
ZONES = (
    "UTC", "Europe/London", "Europe/Berlin", "Europe/Athens", "Europe/Moscow", "Asia/Dubai",
    "Asia/Karachi", "Asia/Kolkata", "Asia/Dhaka", "Asia/Bangkok", "Asia/Shanghai", "Asia/Tokyo",
    "Australia/Adelaide", "Australia/Sydney", "Pacific/Auckland", "Pacific/Honolulu",
    "America/Anchorage", "America/Los_Angeles", "America/Denver", "America/Chicago",
    "America/New_York", "America/Halifax", "America/St_Johns", "America/Sao_Paulo",
    "Atlantic/Azores", "Africa/Lagos", "Africa/Cairo", "Africa/Nairobi", "Asia/Tehran", "Asia/Kathmandu",
)  # fmt: skip
TENANTS = 10_000
TICK_TARGET_MS = 50.0
JOB = "bench.tenant_morning"


@dataclass(frozen=True)
class Plan:
    tenants: int
    ticks: int


FULL = Plan(tenants=TENANTS, ticks=30)
QUICK = Plan(tenants=TENANTS, ticks=5)


def bench_zone(tenant_id: object) -> str:
    """TENANT_TIMEZONE of this bench: tenant i lives in ZONES[i % 30]."""
    return ZONES[int(str(tenant_id)) % len(ZONES)]


def _noop(payload: dict[str, object], ctx: object) -> None:
    return None


def measure_schedules(env: BenchEnv, plan: Plan, console: Console) -> list[Figure]:
    from django.conf import settings
    from django.test import override_settings

    from kumiko_jobs import cron
    from kumiko_jobs.connection import get_keys, get_redis
    from kumiko_jobs.registry import build_definition, registry
    from kumiko_jobs.scheduling.lease import LeaderLease
    from kumiko_jobs.scheduling.planner import Planner
    from kumiko_jobs.scheduling.specs import lane_schedules
    from kumiko_jobs.scheduling.zones import rebuild_zone_index

    console.log(f"schedules: leader cost per tick, {plan.tenants:,} tenants in {len(ZONES)} zones")
    config = {**settings.KUMIKO_JOBS, "TENANT_TIMEZONE": "bench.schedules.bench_zone"}
    os.environ[FANOUT_TENANTS_ENV] = str(plan.tenants)
    try:
        with override_settings(KUMIKO_JOBS=config), registry.isolated():
            registry.register(
                build_definition(_noop, JOB, {"trigger": cron("* * * * *", tz="tenant"), "per_tenant": True})
            )
            started = time.perf_counter()
            index = rebuild_zone_index()
            rebuild = time.perf_counter() - started
            client, keys = get_redis(), get_keys()
            lease = LeaderLease(client, keys, "worker", "bench")
            token = lease.acquire()
            if token is None:
                raise RuntimeError("the bench prefix's scheduler lease is taken")
            minute = (int(time.time()) // 60) * 60
            clock = _Clock(minute - 30.0)
            planner = Planner(lane_schedules("worker"), lease=lease, client=client, keys=keys, clock=clock)
            planner.load(token)
            seconds = []
            for tick in range(plan.ticks):
                clock.t = minute + 60.0 * tick + 0.05
                started = time.perf_counter()
                planner.step(token)
                seconds.append(time.perf_counter() - started)
            lease.release(token)
            from kumiko_jobs.models import JobRun

            wrappers = JobRun.objects.filter(job_name=f"_per_tenant:{JOB}").count()
    finally:
        os.environ.pop(FANOUT_TENANTS_ENV, None)
        delete_own_keys(env.client, env.prefix)
        delete_own_rows(env.prefix)
    per_tick = statistics.median(seconds) * 1000
    return [
        Figure(
            "leader cost per tick (tz=tenant)",
            f"{per_tick:.1f} ms (max {max(seconds) * 1000:.1f})",
            f"< {TICK_TARGET_MS:g} ms",
            per_tick < TICK_TARGET_MS,
            f"median of {plan.ticks} ticks; {index.tenants:,} tenants in {len(index.zones)} zones, "
            f"{wrappers // plan.ticks} wrappers recorded and pushed per tick",
        ),
        Figure(
            "zone index rebuild",
            f"{rebuild * 1000:.0f} ms",
            "",
            None,
            f"O(tenants), every TENANT_ZONE_REFRESH s in a helper thread: {index.tenants:,} tenants",
        ),
    ]


class _Clock:
    def __init__(self, start: float) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t
