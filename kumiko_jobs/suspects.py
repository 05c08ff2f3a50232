"""Runs Redis does not hold are only suspects: they are pushed again once their loss is confirmed.

The outbox, the rebuild and the stale-run repair (rebuild.py, repair.py) read unfinished rows,
then ask Redis for their jobs. A job that finished in between is gone from Redis too: a worker
deletes its hash as it tells Redis of a success, and the success's UPDATE can still be on its
way then (a worker sends it before telling Redis and reads its answer after; a write that fails
is written again on a fresh connection). Pushing such a run again would run it twice, and on a
busy lane whose oldest rows are the ones being worked on it happened every few seconds.

So a run found missing is noted here, with the ``updated_at`` it was read with, and pushed again
only if ``CONFIRM_AFTER`` seconds later its row still has that ``updated_at`` and its status,
and Redis still does not hold its job. Every write that moves a run on sets ``updated_at``
(the outbox also checks ``pushed_at``). Suspects live in a sorted set per lane and task
(score: when noted), so any worker of the lane confirms them, also after the one that noted
them died.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import redis
from django.db.models import Q
from rq.utils import as_text

from kumiko_jobs.models import JobRun

# Far longer than a success's write takes to land, or to be written again on a new connection.
CONFIRM_AFTER = 5.0
BATCH = 500


@dataclass(frozen=True)
class Suspects:
    """One task's suspects on one lane; ``still_lost`` is the filter a confirmed row must match
    besides its unchanged ``updated_at`` (this deployment's runs, status, ``pushed_at``)."""

    key: str
    still_lost: Q

    def note(self, client: redis.Redis, rows: Sequence[JobRun]) -> None:
        """Remember runs Redis did not hold (a run noted twice keeps its first time)."""
        if rows:
            now = time.time()
            client.zadd(self.key, {_member(row): now for row in rows}, nx=True)

    def due(self, client: redis.Redis, fields: Sequence[str]) -> Due:
        """Suspects noted CONFIRM_AFTER ago or earlier (at most BATCH), with the rows among them
        that are still unchanged and match ``still_lost``. Redis is not asked here: the caller
        checks (and pushes uniquely) after its own filters."""
        cutoff = time.time() - CONFIRM_AFTER
        raw = client.zrangebyscore(self.key, "-inf", cutoff, start=0, num=BATCH)
        members = [as_text(m) for m in raw if isinstance(m, bytes | str)]
        if not members:
            return Due([], [])
        unchanged = Q()
        for member in members:
            pk, _, stamp = member.partition("|")
            unchanged |= Q(pk=pk, updated_at=datetime.fromisoformat(stamp))
        rows = list(JobRun.objects.filter(self.still_lost, unchanged).only(*fields))
        return Due(members, rows)

    def forget(self, client: redis.Redis, due: Due) -> None:
        """Done with these suspects (pushed again, or no longer lost)."""
        if due.members:
            client.zrem(self.key, *due.members)

    def count(self, client: redis.Redis) -> int:
        return int(client.zcard(self.key))


@dataclass(frozen=True)
class Due:
    members: list[str]  # the suspects looked at
    rows: list[JobRun]  # those whose rows still say they are lost


def _member(row: JobRun) -> str:
    return f"{row.pk}|{row.updated_at.isoformat()}"
