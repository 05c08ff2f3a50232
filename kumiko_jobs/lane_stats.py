"""What the lanes hold now and what they did in the last hours, read from Redis alone.

The admin console's counts come from here, so a page load costs a few pipelined Redis reads
whatever the size of the run table: no COUNT(*) over it.

- *Now*: queued = the lengths of the flows that hold work (O(flows with work)) plus RQ's plain
  list; scheduled, running and kept failures = the sizes of RQ's registries. Per tenant, queued
  runs come from tenant-named flows (flows.tenant_of_flow), running ones from the started
  registry (at most the number of busy workers), scheduled ones from the scheduled set while it
  holds at most ``ATTRIBUTE_SCHEDULED`` jobs (above that the per-tenant figure is unknown).
- *Past hours*: the finish-and-claim script counts every ended attempt in hourly hashes per
  lane (by outcome, by job and outcome, by tenant for succeeded/failed) and final failures per
  tenant in a sorted set (lua/common.lua ``count_outcome``): two or three HINCRBYs inside a call
  the worker makes anyway.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

import redis
from rq.utils import as_text

from kumiko_jobs.flows import tenant_of_flow
from kumiko_jobs.keys import LANES, NO_TENANT, Keys
from kumiko_jobs.registry import registry

HOURS = 24
OUTCOMES = ("succeeded", "failed", "retried", "deferred")
ATTRIBUTE_SCHEDULED = 5000
ATTRIBUTE_RUNNING = 5000


@dataclass(frozen=True)
class Depth:
    queued: int
    scheduled: int
    running: int
    failed_kept: int  # failed jobs RQ's failed registry keeps (FAILURE_TTL)


@dataclass
class TenantDepth:
    queued: int = 0
    running: int = 0
    scheduled: int | None = 0  # None: too many scheduled jobs to attribute


@dataclass(frozen=True)
class Hour:
    start: int  # unix time of the hour's start
    counts: dict[str, int] = field(default_factory=dict)

    def get(self, outcome: str) -> int:
        return self.counts.get(outcome, 0)


def current_hour(now: float | None = None) -> int:
    return int((time.time() if now is None else now) // 3600)


def lane_depth(client: redis.Redis, keys: Keys, lane: str) -> Depth:
    flows = [as_text(flow) for flow in client.hkeys(keys.flow_states(lane))]
    pipe = client.pipeline(transaction=False)
    pipe.llen(keys.queue(lane))
    for flow in flows:
        pipe.llen(keys.flow(lane, flow))
    pipe.zcard(keys.scheduled(lane))
    pipe.zcard(keys.started(lane))
    pipe.zcard(keys.failed(lane))
    *lengths, scheduled, running, failed = (int(n) for n in pipe.execute())
    return Depth(sum(lengths), scheduled, running, failed)


def tenant_depths(client: redis.Redis, keys: Keys, lane: str) -> dict[str | None, TenantDepth]:
    """Per tenant (None: runs without a tenant; "*": runs of job-scoped flows, whatever the
    tenant), what lane ``lane`` holds now."""
    out: dict[str | None, TenantDepth] = {}
    names = {d.name for d in registry.all()}
    flows = [as_text(flow) for flow in client.hkeys(keys.flow_states(lane))]
    pipe = client.pipeline(transaction=False)
    for flow in flows:
        pipe.llen(keys.flow(lane, flow))
    for flow, length in zip(flows, pipe.execute(), strict=True):
        if length:
            out.setdefault(tenant_of_flow(flow, names), TenantDepth()).queued += int(length)
    members = cast("list[bytes]", client.zrange(keys.started(lane), 0, ATTRIBUTE_RUNNING - 1))
    for tenant in _tenants_of(client, keys, (as_text(m).split(":", 1)[0] for m in members)):
        out.setdefault(tenant, TenantDepth()).running += 1
    if client.zcard(keys.scheduled(lane)) > ATTRIBUTE_SCHEDULED:
        for depth in out.values():
            depth.scheduled = None
        return out
    waiting = cast("list[bytes]", client.zrange(keys.scheduled(lane), 0, -1))
    scheduled = [as_text(m) for m in waiting]
    for tenant in _tenants_of(client, keys, scheduled):
        depth = out.setdefault(tenant, TenantDepth())
        depth.scheduled = (depth.scheduled or 0) + 1
    return out


def _tenants_of(client: redis.Redis, keys: Keys, job_ids: Iterable[str]) -> list[str | None]:
    pipe = client.pipeline(transaction=False)
    count = 0
    for job_id in job_ids:
        pipe.hget(keys.job(job_id), "meta")
        count += 1
    if not count:
        return []
    tenants: list[str | None] = []
    for raw in pipe.execute():
        try:
            tenant = json.loads(raw).get("tenant") if raw else None
        except (ValueError, AttributeError):
            tenant = None
        tenants.append(None if tenant is None else str(tenant))
    return tenants


def hourly(
    client: redis.Redis, keys: Keys, lane: str, *, hours: int = HOURS, now: float | None = None
) -> list[Hour]:
    """The lane's attempt outcomes per hour, oldest first, the current hour last."""
    last = current_hour(now)
    span = range(last - hours + 1, last + 1)
    pipe = client.pipeline(transaction=False)
    for hour in span:
        pipe.hmget(keys.stats(lane, hour), list(OUTCOMES))
    return [
        Hour(hour * 3600, {o: int(v or 0) for o, v in zip(OUTCOMES, values, strict=True)})
        for hour, values in zip(span, pipe.execute(), strict=True)
    ]


def job_outcomes(
    client: redis.Redis, keys: Keys, *, hours: int = HOURS, now: float | None = None
) -> dict[str, Counter[str]]:
    """Per job, attempt outcomes over the last ``hours`` (both lanes)."""
    last = current_hour(now)
    pipe = client.pipeline(transaction=False)
    for lane in LANES:
        for hour in range(last - hours + 1, last + 1):
            pipe.hgetall(keys.stats(lane, hour))
    out: dict[str, Counter[str]] = {}
    for counts in pipe.execute():
        for raw_field, value in counts.items():
            name = as_text(raw_field)
            if not name.startswith("j|"):
                continue
            job, _, outcome = name[2:].rpartition("|")
            out.setdefault(job, Counter())[outcome] += int(value)
    return out


def tenant_outcomes(
    client: redis.Redis,
    keys: Keys,
    tenants: Iterable[str | None],
    *,
    hours: int = HOURS,
    now: float | None = None,
) -> dict[str | None, Counter[str]]:
    """Succeeded and failed runs of these tenants over the last ``hours`` (both lanes)."""
    wanted = list(dict.fromkeys(tenants))
    if not wanted:
        return {}
    fields = [f"{tenant or NO_TENANT}|{outcome}" for tenant in wanted for outcome in ("succeeded", "failed")]
    last = current_hour(now)
    pipe = client.pipeline(transaction=False)
    for lane in LANES:
        for hour in range(last - hours + 1, last + 1):
            pipe.hmget(keys.tenant_stats(lane, hour), fields)
    out: dict[str | None, Counter[str]] = {tenant: Counter() for tenant in wanted}
    for values in pipe.execute():
        for index, value in enumerate(values):
            if value:
                tenant, outcome = wanted[index // 2], ("succeeded", "failed")[index % 2]
                out[tenant][outcome] += int(value)
    return out


def failing_tenants(
    client: redis.Redis, keys: Keys, *, limit: int = 10, hours: int = HOURS, now: float | None = None
) -> list[tuple[str | None, int]]:
    """The tenants with the most final failures over the last ``hours``, most first."""
    last = current_hour(now)
    names = [keys.failing_tenants(lane, hour) for lane in LANES for hour in range(last - hours + 1, last + 1)]
    # ZUNION reads only the tenants that failed (failures are the rare outcome), not all tenants.
    union = cast("list[tuple[bytes, float]]", client.zunion(names, withscores=True))
    pairs = [(as_text(member), int(score)) for member, score in union]
    pairs.sort(key=lambda pair: (-pair[1], pair[0]))
    return [(None if tenant == NO_TENANT else tenant, count) for tenant, count in pairs[:limit]]
