"""Every Redis key and RQ queue name kumiko_jobs uses, derived from ``QUEUE_PREFIX`` in one place.

RQ's own structures (job hashes, queue lists, registries) keep RQ's layout so django-rq's
dashboard and RQ tooling keep working; their names carry the prefix through the queue name
(``rq:queue:<prefix>:<lane>``) or the job id (``<tag>-<hex>``). Our own keys live under
``<prefix>:``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property

LANES = ("api", "worker")
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True)
class Keys:
    prefix: str

    @cached_property
    def id_tag(self) -> str:
        """Job-id prefix: RQ ids allow only [A-Za-z0-9_-] and live in one global namespace."""
        tag = _UNSAFE.sub("_", self.prefix)
        if tag != self.prefix:
            # Keep 'a:b' and 'a_b' apart after sanitising.
            tag += "_" + hashlib.sha1(self.prefix.encode(), usedforsecurity=False).hexdigest()[:6]
        return tag

    def queue_name(self, lane: str) -> str:
        return f"{self.prefix}:{lane}"

    def lane_of_queue(self, queue_name: str) -> str | None:
        """The lane whose RQ queue name this is under this prefix, or None."""
        return next((lane for lane in LANES if self.queue_name(lane) == queue_name), None)

    # RQ structures of a lane -------------------------------------------------------------
    def queue(self, lane: str) -> str:
        return f"rq:queue:{self.queue_name(lane)}"

    def started(self, lane: str) -> str:
        return f"rq:wip:{self.queue_name(lane)}"

    def finished(self, lane: str) -> str:
        return f"rq:finished:{self.queue_name(lane)}"

    def failed(self, lane: str) -> str:
        return f"rq:failed:{self.queue_name(lane)}"

    def scheduled(self, lane: str) -> str:
        return f"rq:scheduled:{self.queue_name(lane)}"

    @staticmethod
    def job(job_id: str) -> str:
        return f"rq:job:{job_id}"

    @staticmethod
    def worker(name: str) -> str:
        return f"rq:worker:{name}"

    # Our own keys ------------------------------------------------------------------------
    def lane(self, lane: str) -> str:
        """Prefix of a lane's fair-queue keys: flows (q:<flow>), ring, st, run, wake."""
        return f"{self.prefix}:{lane}:"

    def flow(self, lane: str, flow: str) -> str:
        return f"{self.prefix}:{lane}:q:{flow}"

    def ring(self, lane: str) -> str:
        return f"{self.prefix}:{lane}:ring"

    def wake(self, lane: str) -> str:
        return f"{self.prefix}:{lane}:wake"

    @property
    def active(self) -> str:
        """Hash of queued+running counts per limit key (skip limits), across both lanes."""
        return f"{self.prefix}:active"

    def debounce(self, scope_key: str) -> str:
        return f"{self.prefix}:debounce:{scope_key}"

    def claimers(self, lane: str) -> str:
        """Set of worker names consuming this lane (for operators and tests)."""
        return f"{self.prefix}:{lane}:claimers"

    def reaper_lock(self, lane: str) -> str:
        return f"{self.prefix}:{lane}:reaper"
