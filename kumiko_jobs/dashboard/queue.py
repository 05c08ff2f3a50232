"""The RQ queue class django-rq uses: for a kumiko lane it counts and lists the lane's flows.

A lane's queued jobs are not on RQ's plain list but in per-tenant flows (``scripts.py``), so
RQ's ``count`` and ``get_job_ids`` would show an empty queue. django-rq 4.2 builds its queues
with ``RQ["QUEUE_CLASS"]`` (a per-queue ``QUEUE_CLASS`` is ignored by most views), so this class
is installed globally (``dashboard/setup.py``) and stays a plain ``DjangoRQ`` for any queue
that is not a lane of this project's prefix. Counting reads the flows that hold work: O(flows
with work), for dashboards, never on the job path. Ordered flows (Django tasks) are sorted sets,
listed in the order they are served.
"""

from __future__ import annotations

from typing import Any

import redis
from django_rq.queues import DjangoRQ
from rq.serializers import JSONSerializer
from rq.utils import as_text

from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.flows import is_ordered


def lane_of(queue_name: str) -> str | None:
    """The lane whose RQ queue this is under the current prefix, or None."""
    return get_keys().lane_of_queue(queue_name)


class LaneQueue(DjangoRQ):
    def __init__(self, name: str = "default", connection: redis.Redis | None = None, **kwargs: Any) -> None:
        self.lane = lane_of(name)
        if self.lane is not None:
            # kumiko's own client (one pool for dispatch, workers and the dashboard) and its
            # serializer: lane jobs are JSON, never pickle.
            connection = get_redis()
            kwargs["serializer"] = JSONSerializer
        super().__init__(name, connection=connection, **kwargs)  # type: ignore[no-untyped-call]

    def _lists(self) -> list[tuple[str, bool]]:
        """RQ's plain list (ids stock RQ pushed, not swept yet), then the flows in ring order,
        then the parked ones; each with whether it is an ordered flow (a sorted set)."""
        if self.lane is None:
            return [(self.key, False)]
        keys = get_keys()
        pipe = self.connection.pipeline(transaction=False)
        pipe.lrange(keys.ring(self.lane), 0, -1)
        pipe.hkeys(keys.flow_states(self.lane))
        ring_raw, states_raw = pipe.execute()
        ring = [as_text(flow) for flow in ring_raw]
        parked = sorted({as_text(flow) for flow in states_raw} - set(ring))
        flows = [(keys.flow(self.lane, flow), is_ordered(flow)) for flow in [*ring, *parked]]
        return [(self.key, False), *flows]

    def _lengths(self) -> list[tuple[tuple[str, bool], int]]:
        lists = self._lists()
        pipe = self.connection.pipeline(transaction=False)
        for key, ordered in lists:
            if ordered:
                pipe.zcard(key)
            else:
                pipe.llen(key)
        return list(zip(lists, (int(n) for n in pipe.execute()), strict=True))

    @property
    def count(self) -> int:
        if self.lane is None:
            return super().count
        return sum(n for _, n in self._lengths())

    def get_job_ids(self, offset: int = 0, length: int = -1) -> list[str]:
        if self.lane is None:
            return super().get_job_ids(offset, length)
        wanted = None if length < 0 else length
        pipe = self.connection.pipeline(transaction=False)
        skip = max(offset, 0)
        for (key, ordered), size in self._lengths():
            if wanted is not None and wanted <= 0:
                break
            if skip >= size:
                skip -= size
                continue
            take = size - skip if wanted is None else min(size - skip, wanted)
            if ordered:
                pipe.zrange(key, skip, skip + take - 1)
            else:
                pipe.lrange(key, skip, skip + take - 1)
            skip = 0
            if wanted is not None:
                wanted -= take
        return [as_text(job_id) for chunk in pipe.execute() for job_id in chunk]

    def oldest_enqueued_at(self) -> str | None:
        """``enqueued_at`` of the oldest head of the lane's lists (RQ's format), or None."""
        lists = [key for key, size in self._lengths() if size]
        if not lists:
            return None
        pipe = self.connection.pipeline(transaction=False)
        for key, ordered in lists:
            if ordered:
                pipe.zrange(key, 0, 0)
            else:
                pipe.lindex(key, 0)
        heads = [as_text(head[0] if isinstance(head, list) else head) for head in pipe.execute() if head]
        for head in heads:
            pipe.hget(get_keys().job(head), "enqueued_at")
        stamps = [as_text(stamp) for stamp in pipe.execute() if stamp]
        return min(stamps) if stamps else None
