"""An RQ Queue class that sees a lane's flows, so django-rq's dashboard counts and lists them.

Configure it per lane in ``RQ_QUEUES[...]["QUEUE_CLASS"]``. Counting walks the flows that hold
work (ring + parked), which is O(flows with work): fine for a dashboard, never used on the
job path. Ordered flows (Django tasks) are sorted sets, listed in the order they are served.
"""

from __future__ import annotations

from django_rq.queues import DjangoRQ
from rq.utils import as_text

from kumiko_jobs.flows import is_ordered


class LaneQueue(DjangoRQ):
    def _flow_keys(self) -> list[tuple[str, bool]]:
        lane = f"{self.name}:"
        flows = [as_text(flow) for flow in self.connection.hkeys(lane + "st")]
        return [(f"{lane}q:{flow}", is_ordered(flow)) for flow in flows]

    @property
    def count(self) -> int:
        keys = self._flow_keys()
        pipe = self.connection.pipeline(transaction=False)
        pipe.llen(self.key)
        for key, ordered in keys:
            if ordered:
                pipe.zcard(key)
            else:
                pipe.llen(key)
        return sum(int(n) for n in pipe.execute())

    def get_job_ids(self, offset: int = 0, length: int = -1) -> list[str]:
        ids: list[str] = [as_text(i) for i in self.connection.lrange(self.key, 0, -1)]
        for key, ordered in self._flow_keys():
            if length >= 0 and len(ids) >= offset + length:
                break
            if ordered:
                ids.extend(
                    as_text(i) for i in self.connection.zrange(key, 0, -1) if isinstance(i, bytes | str)
                )
            else:
                ids.extend(as_text(i) for i in self.connection.lrange(key, 0, -1))
        return ids[offset:] if length < 0 else ids[offset : offset + length]
