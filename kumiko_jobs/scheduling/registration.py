"""Which schedules exist: "seen" stamps from live processes, and removal of orphans.

Every runjobs process (followers and ``--no-scheduler`` ones too) stamps the schedules it
declares for its lane every SEEN_INTERVAL; the first stamp of a fixed-zone schedule also starts
its cursor at that moment, so a schedule added by a rolling deploy is caught up from when its
first process came up, whichever version leads meanwhile. The leader removes a schedule whose
newest stamp is older than ORPHAN_GRACE: no live process has declared it for that long. During
a rolling deploy the old processes still stamp the old schedules, so nothing they declare is
removed while any of them runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis
from rq.utils import as_text

from kumiko_jobs.keys import Keys
from kumiko_jobs.scheduling.specs import Schedule

logger = logging.getLogger("kumiko_jobs")
MAX_SEEN_INTERVAL = 60.0


def seen_interval(orphan_grace: float) -> float:
    """Stamps are refreshed several times per grace period, so a live schedule never looks orphaned."""
    return min(MAX_SEEN_INTERVAL, orphan_grace / 4)


def stamp_declared(
    client: redis.Redis, keys: Keys, lane: str, schedules: Sequence[Schedule], now: float
) -> None:
    if not schedules:
        return
    pipe = client.pipeline(transaction=False)
    pipe.zadd(keys.schedules_seen(lane), {s.id: now for s in schedules})
    for schedule in schedules:
        if not schedule.tenant_local:  # a tz="tenant" schedule's zones start when the leader sees them
            pipe.hsetnx(keys.schedule_cursor(lane, schedule.id), schedule.tz, now)
    pipe.execute()


def registered_schedules(client: redis.Redis, keys: Keys, lane: str) -> dict[str, float]:
    """Schedule id -> newest "seen" stamp, for every schedule registered on ``lane``."""
    stamps: list[tuple[bytes, float]] = client.zrange(keys.schedules_seen(lane), 0, -1, withscores=True)  # type: ignore[assignment]
    return {as_text(member): float(score) for member, score in stamps}


def remove_orphans(client: redis.Redis, keys: Keys, lane: str, now: float, grace: float) -> list[str]:
    """Remove schedules no live process stamped for ``grace`` seconds, with their cursors.
    Atomic against a stamp arriving meanwhile (WATCH): then nothing is removed this round."""
    seen = keys.schedules_seen(lane)
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(seen)  # type: ignore[no-untyped-call]
            members: list[bytes] = pipe.zrangebyscore(seen, "-inf", now - grace)  # type: ignore[assignment]
            stale = [as_text(member) for member in members]
            if not stale:
                pipe.reset()
                return []
            pipe.multi()
            pipe.zrem(seen, *stale)
            pipe.delete(*(keys.schedule_cursor(lane, schedule_id) for schedule_id in stale))
            pipe.execute()
        except redis.WatchError:
            return []
    for schedule_id in stale:
        logger.info(
            "kumiko_jobs: removed orphaned schedule %r of lane %s: no live process has declared it "
            "for %gs (ORPHAN_GRACE).",
            schedule_id,
            lane,
            grace,
        )
    return stale
