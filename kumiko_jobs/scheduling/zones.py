"""The tenant zone index: which tenants live in which time zone, for cron(..., tz="tenant").

A tz="tenant" tick must not cost the leader O(tenants), so tenants are grouped by zone ahead of
time: a rebuild reads ACTIVE_TENANTS once, asks TENANT_TIMEZONE for each tenant (O(tenants) per
rebuild, never per tick) and writes one list of tenant ids per zone plus a hash zone -> count,
under a new generation number, then switches the current generation in one write. The leader
reads only the zones (O(zones)); each zone's fan-out wrapper reads its own zone's list. Two
rebuilds at once (``refresh_tenant_zones()`` beside the leader's) need no lock: a generation is
numbered before its read, and the switch only goes forward (lua/zone_switch.lua).

Refresh: the leader of a lane with tz="tenant" schedules rebuilds the index when it is older
than TENANT_ZONE_REFRESH seconds (default 300), in a helper thread so ticks are not delayed;
``kumiko_jobs.scheduling.refresh_tenant_zones()`` rebuilds it at once. A tenant that changes
zone, or a new tenant, is therefore scheduled in its new zone from the next rebuild on; until
then it fires at its old zone's local time (or, if new, not at all). Old generations expire an
hour after they are replaced, so a wrapper that started reading one finishes on it.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import redis
from django.db import InterfaceError, OperationalError
from rq.utils import as_text

from kumiko_jobs.conf import import_setting
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.keys import Keys
from kumiko_jobs.scheduling.cronmath import zone as zone_info
from kumiko_jobs.scheduling.lease import write_if_value
from kumiko_jobs.scripts import scripts_for
from kumiko_jobs.tenancy import active_tenant_ids, listed_tenant_id

logger = logging.getLogger("kumiko_jobs")
DEFAULT_ZONE = "UTC"
PAGE = 1000
OLD_GENERATION_TTL = 3600
LOCK_SECONDS = 300


@dataclass(frozen=True)
class ZoneIndex:
    generation: int
    refreshed_at: float
    zones: dict[str, int]  # zone -> number of tenants

    @property
    def tenants(self) -> int:
        return sum(self.zones.values())


def tenant_zone_function() -> Callable[[Any], str] | None:
    return import_setting("TENANT_TIMEZONE")  # type: ignore[no-any-return]


@cache
def _valid_zone(name: str) -> bool:
    try:
        zone_info(name)
    except (ValueError, KeyError):  # ZoneInfoNotFoundError is a KeyError
        return False
    return True


# SQLSTATEs of a server that is going away or not up yet (admin or crash shutdown, starting).
_SERVER_GONE = ("57P01", "57P02", "57P03")


def _connection_failed(exc: Exception) -> bool:
    """Whether a database error is the connection's or the server's, not one query's: an
    InterfaceError, or an OperationalError with no SQLSTATE (the client lost the server; also
    SQLite's, kept on the safe side), of class 08 (connection exception) or a shutdown's. A
    query of one tenant's cancelled by statement_timeout (57014) or a lock timeout (55P03),
    though OperationalErrors too, are that tenant's."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    return not state or state.startswith("08") or state in _SERVER_GONE


def zones_of_tenants(tenants: Iterator[Any] | Any) -> dict[str, list[str]]:
    """Group tenant ids by TENANT_TIMEZONE; an unknown zone puts the tenant in UTC, logged."""
    zone_of = tenant_zone_function()
    groups: dict[str, list[str]] = defaultdict(list)
    bad: list[tuple[str, Any]] = []
    for tenant in tenants:
        listed = listed_tenant_id(tenant)
        if listed is None:
            continue
        tenant_id = listed
        try:
            name = zone_of(tenant) if zone_of is not None else DEFAULT_ZONE
        except Exception as exc:  # the project's function: one tenant must not stop the index
            if _connection_failed(exc):
                # The database, not this tenant (a restart, a failover): every tenant would land
                # in UTC, and the planner would drop the other zones' cursors. The rebuild is
                # given up, the installed index stays, and the next refresh tries again.
                raise
            name = f"<{exc.__class__.__name__}: {exc}>"
        if not isinstance(name, str) or not _valid_zone(name):
            bad.append((tenant_id, name))
            name = DEFAULT_ZONE
        groups[name].append(tenant_id)
    if bad:
        logger.warning(
            "kumiko_jobs: TENANT_TIMEZONE returned no valid IANA zone for %d tenant(s), scheduled in "
            "UTC instead: %s. Return names such as 'Europe/Berlin'.",
            len(bad),
            ", ".join(f"{t}={z!r}" for t, z in bad[:10]) + (" ..." if len(bad) > 10 else ""),
        )
    return dict(groups)


def rebuild_zone_index(client: redis.Redis | None = None, keys: Keys | None = None) -> ZoneIndex:
    """Read every active tenant's zone and install a new index generation. Safe beside another
    rebuild: the one that read the tenants later wins, and the other's generation expires."""

    client, keys = client or get_redis(), keys or get_keys()
    # Numbered before the read: a later generation began its read later. (Two reads that overlap
    # can still see a tenant's change in the other order; the next refresh settles it.)
    generation = int(client.hincrby(keys.tenant_zones_generation, "next", 1))
    groups = zones_of_tenants(active_tenant_ids())
    written = [keys.tenant_zone_members(generation, name) for name in groups]
    pipe = client.pipeline(transaction=False)
    for key, members in zip(written, groups.values(), strict=True):
        for start in range(0, len(members), PAGE):
            pipe.rpush(key, *members[start : start + PAGE])
    if groups:
        pipe.hset(keys.tenant_zones(generation), mapping={name: len(m) for name, m in groups.items()})
    pipe.execute()
    now = time.time()
    # The switch: one write, after the generation is complete, and only forward.
    replaced = int(
        scripts_for(client).zone_switch(keys=[keys.tenant_zones_generation], args=[generation, now])
    )
    if replaced < 0:
        # A rebuild that read the tenants after this one installed its index meanwhile.
        _expire_generation(client, keys, generation, list(groups))
        logger.info("kumiko_jobs: tenant zone index %d replaced by a later rebuild at once", generation)
        found = current_index(client, keys)
        return found if found is not None else ZoneIndex(generation, now, {})
    if replaced:
        old_zones = [as_text(name) for name in client.hkeys(keys.tenant_zones(replaced))]
        _expire_generation(client, keys, replaced, old_zones)
    index = ZoneIndex(generation, now, {name: len(m) for name, m in groups.items()})
    logger.info(
        "kumiko_jobs: tenant zone index %d: %d tenants in %d zones", generation, index.tenants, len(groups)
    )
    return index


def _expire_generation(client: redis.Redis, keys: Keys, generation: int, zones: list[str]) -> None:
    """A replaced generation's keys go after OLD_GENERATION_TTL: a wrapper reading one finishes."""
    pipe = client.pipeline(transaction=False)
    for key in [keys.tenant_zones(generation), *(keys.tenant_zone_members(generation, z) for z in zones)]:
        pipe.expire(key, OLD_GENERATION_TTL)
    pipe.execute()


def current_index(client: redis.Redis, keys: Keys) -> ZoneIndex | None:
    """The installed index (zones and counts, not tenants: O(zones)); None before the first."""
    raw = client.hmget(keys.tenant_zones_generation, ["gen", "at"])
    if raw[0] is None:
        return None
    generation = int(raw[0])
    zones = {as_text(k): int(v) for k, v in client.hgetall(keys.tenant_zones(generation)).items()}
    return ZoneIndex(generation, float(raw[1] or 0), zones)


def current_generation(client: redis.Redis, keys: Keys) -> tuple[int, float] | None:
    raw = client.hmget(keys.tenant_zones_generation, ["gen", "at"])
    return None if raw[0] is None else (int(raw[0]), float(raw[1] or 0))


def tenants_in_zone(zone: str, client: redis.Redis | None = None, keys: Keys | None = None) -> Iterator[str]:
    """The tenant ids of ``zone`` in the current index, page by page."""
    client, keys = client or get_redis(), keys or get_keys()
    found = current_generation(client, keys)
    if found is None:
        return
    key = keys.tenant_zone_members(found[0], zone)
    start = 0
    while page := client.lrange(key, start, start + PAGE - 1):
        yield from (as_text(member) for member in page)
        start += len(page)


def try_rebuild_lock(client: redis.Redis, keys: Keys, owner: str) -> bool:
    """One rebuild at a time across lanes and processes; ``owner``: a token of this attempt's
    own (a worker name repeats where two hosts share a ``--name``)."""
    return bool(client.set(keys.tenant_zones_lock, owner, nx=True, ex=LOCK_SECONDS))


def release_rebuild_lock(client: redis.Redis, keys: Keys, owner: str) -> None:
    """Release the lock if ``owner`` still holds it: a rebuild that outlived LOCK_SECONDS must
    not release the next rebuild's lock, which would let a third start beside it."""
    write_if_value(client, keys.tenant_zones_lock, owner, lambda pipe: pipe.delete(keys.tenant_zones_lock))
