"""What the lanes hold now and what they did in the last hours, read from Redis alone.

The admin console's counts come from here, so a page load costs a few pipelined Redis reads
whatever the size of the run table: no COUNT(*) over it.

- *Now*: a lane's queued, scheduled, running and kept failures come from metrics.lane_depths
  (a counter and the sizes of RQ's registries, O(1)). Per tenant, queued
  runs come from tenant-named flows (flows.tenant_of_flow), running ones from the started
  registry (at most the number of busy workers), scheduled ones from the scheduled set while it
  holds at most ``ATTRIBUTE_SCHEDULED`` jobs (above that the per-tenant figure is unknown).
- *Past hours*: the finish-and-claim script counts every ended attempt in an hourly hash per
  lane (by outcome, and by job and outcome) and succeeded runs and final failures per tenant in
  an hourly sorted set each (lua/common.lua ``count_outcome``): three increments inside the
  script call the worker makes for every job anyway. Reading a tenant's 24 hours is one
  ZMSCORE per set; ranking tenants is a ZUNION over the day's sets, cached for 30 s.
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
from kumiko_jobs.keys import LANES, NO_TENANT, Keys, started_job_id
from kumiko_jobs.metrics import lane_depths
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
    """The lane's queued, scheduled, running and kept-failed counts (metrics.lane_depths: O(1))."""
    depth = lane_depths(client, keys, (lane,))[lane]
    return Depth(depth["queued"], depth["scheduled"], depth["running"], depth["failed"])


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
    for tenant in _tenants_of(client, keys, map(started_job_id, members)):
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
    """Succeeded and finally failed runs of these tenants over the last ``hours`` (both lanes):
    one ZMSCORE per hourly set, whatever the number of tenants."""
    wanted = list(dict.fromkeys(tenants))
    out: dict[str | None, Counter[str]] = {tenant: Counter() for tenant in wanted}
    if not wanted:
        return out
    members = [tenant or NO_TENANT for tenant in wanted]
    pipe = client.pipeline(transaction=False)
    kinds = []
    for lane in LANES:
        for hour in _hours(hours, now):
            pipe.zmscore(keys.succeeding_tenants(lane, hour), members)
            pipe.zmscore(keys.failing_tenants(lane, hour), members)
            kinds += ["succeeded", "failed"]
    for outcome, scores in zip(kinds, pipe.execute(), strict=True):
        for tenant, score in zip(wanted, scores, strict=True):
            if score:
                out[tenant][outcome] += int(score)
    return out


def ranked_tenants(
    client: redis.Redis,
    keys: Keys,
    *,
    failures_only: bool = False,
    limit: int = 10,
    hours: int = HOURS,
    now: float | None = None,
) -> list[tuple[str | None, int]]:
    """The tenants with the most ended runs (or final failures) over the last ``hours``.

    ZUNION reads every tenant that ended a run in the window: O(active tenants x hours) inside
    Redis, so the result is cached per process for ``RANK_CACHE_SECONDS``.
    """
    hour_list = tuple(_hours(hours, now))
    cache_key = (keys.prefix, failures_only, hour_list[-1], hours)
    cached = _rank_cache.get(cache_key)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1][:limit]
    names = [keys.failing_tenants(lane, hour) for lane in LANES for hour in hour_list]
    if not failures_only:
        names += [keys.succeeding_tenants(lane, hour) for lane in LANES for hour in hour_list]
    union = cast("list[tuple[bytes, float]]", client.zunion(names, withscores=True))
    pairs = sorted(((as_text(member), int(score)) for member, score in union), key=lambda p: (-p[1], p[0]))
    ranked = [(None if tenant == NO_TENANT else tenant, count) for tenant, count in pairs[:RANK_KEEP]]
    moment = time.monotonic()
    # Keyed by the hour: a long-lived web process would keep every past hour's entry.
    for old in [key for key, (until, _) in _rank_cache.items() if until <= moment]:
        del _rank_cache[old]
    _rank_cache[cache_key] = (moment + RANK_CACHE_SECONDS, ranked)
    return ranked[:limit]


RANK_CACHE_SECONDS = 30.0
RANK_KEEP = 100
_rank_cache: dict[tuple[str, bool, int, int], tuple[float, list[tuple[str | None, int]]]] = {}


def _hours(hours: int, now: float | None) -> range:
    last = current_hour(now)
    return range(last - hours + 1, last + 1)
