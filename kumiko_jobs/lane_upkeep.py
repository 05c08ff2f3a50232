"""A lane's upkeep, run by each of its workers between jobs (one thread) or on the main thread
(``--threads``): promotion of due retries and delayed runs, the reaper of abandoned leases, the
stale-run repair, the outbox of committed runs not yet pushed, the rebuild after Redis lost its
data, and the flush of the lane's claim count. Each task has its own interval; ``due()`` is one
clock read, so a job loop may ask before every job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis
from django.db import DatabaseError

from kumiko_jobs.guarded_writes import database_answers
from kumiko_jobs.lane import promote_due
from kumiko_jobs.leases import reap
from kumiko_jobs.rebuild import push_waiting, rebuild_step
from kumiko_jobs.repair import INTERVAL as REPAIR_INTERVAL
from kumiko_jobs.repair import repair_stale_runs

if TYPE_CHECKING:
    from kumiko_jobs.worker import LaneWorker

logger = logging.getLogger("kumiko_jobs.worker")
REAP_INTERVAL = 5.0
OUTBOX_INTERVAL = 2.0
REBUILD_INTERVAL = 1.0
CLAIMS_FLUSH_INTERVAL = 1.0
# How often a waiting job loop (or the --threads main thread) looks whether upkeep is due.
TICK = 0.2
# Promotion waits at most this long after its last round (its time is the wall clock's, which
# the scheduled set's due times are on): a later one means the clock stepped back.
PROMOTE_INTERVAL = 1.0


class LaneUpkeep:
    def __init__(self, worker: LaneWorker) -> None:
        self.worker = worker
        self.next_promote = 0.0  # moved earlier by job threads (wake_at), hence the lock
        self._lock = threading.Lock()
        self._next_claims_flush = 0.0
        self._next_reap = 0.0
        # The other tasks' times are monotonic: a wall clock stepped back an hour stalled them
        # for that hour.
        self._next_repair = time.monotonic() + REPAIR_INTERVAL
        self._next_outbox = 0.0
        self._next_rebuild = 0.0
        self._database_down_since: float | None = None  # a task found the database unreachable

    def wake_at(self, when: float) -> None:
        """Promote at ``when`` (a run's own retry or deferral), not at the next round."""
        with self._lock:
            self.next_promote = min(self.next_promote, when)

    def due(self) -> bool:
        """Whether run() has anything to do now. run() asks it first, so a task added there
        without its time here runs nowhere (and the suite notices), never only in some workers."""
        if self.worker.schedule and self._promote_due(time.time()):
            return True
        return time.monotonic() >= min(
            self._next_reap, self._next_repair, self._next_outbox, self._next_claims_flush, self._next_rebuild
        )

    def _promote_due(self, wall: float) -> bool:
        return wall >= self.next_promote or self.next_promote - wall > PROMOTE_INTERVAL

    def run_quietly(self) -> None:
        """run(), leaving a Redis outage to the claimer, which waits it out and reports it."""
        try:
            self.run()
        except redis.RedisError:
            pass

    def run(self) -> None:
        if not self.due():
            return
        w = self.worker
        client, keys, lane = w.client, w.keys, w.lane
        wall = time.time()
        if w.schedule and self._promote_due(wall):
            next_due = promote_due(client, keys, lane)
            with self._lock:
                ahead = wall + PROMOTE_INTERVAL
                self.next_promote = min(ahead, next_due) if next_due else ahead
        now = time.monotonic()
        if now >= self._next_reap:
            self._next_reap = now + REAP_INTERVAL
            self._guarded("reaper", reap, client, keys, lane, w.name)
        if now >= self._next_repair:
            self._next_repair = now + REPAIR_INTERVAL
            self._guarded("repair", repair_stale_runs, client, keys, lane)
        if now >= self._next_outbox:
            self._next_outbox = now + OUTBOX_INTERVAL
            self._guarded("outbox", push_waiting, client, keys, lane)
        if now >= self._next_claims_flush:
            self._next_claims_flush = now + CLAIMS_FLUSH_INTERVAL
            w.flush_claims()
        if now >= self._next_rebuild:
            # A batch of a rebuild when Redis lost its data; one MGET otherwise.
            self._next_rebuild = now + REBUILD_INTERVAL
            self._guarded("rebuild", rebuild_step, client, keys, lane)

    def nothing_due(self) -> bool:
        """Nothing queued or due in the lane (--burst ends), after promoting what is due."""
        w = self.worker
        if not w.schedule:
            return True
        next_due = promote_due(w.client, w.keys, w.lane)
        if next_due is not None and next_due <= time.time():
            return False
        # promote_due may have moved work into the lane; the next claim tells.
        return not w.client.exists(w.keys.ring(w.lane))

    def _guarded[**P](self, task: str, run: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> None:
        """Run an upkeep task; only a Redis outage (handled by the caller) gets past it. While the
        database does not answer at all, the tasks that need it fail quietly: one line when the
        outage starts and one when it ends, not a traceback per task and interval."""
        name = self.worker.name
        try:
            run(*args, **kwargs)
        except redis.RedisError:
            raise
        except DatabaseError as exc:
            if database_answers():
                logger.exception("worker %s: %s failed; it runs again at its next interval", name, task)
            elif self._database_down_since is None:
                self._database_down_since = time.monotonic()
                logger.warning(
                    "worker %s: database unreachable (%s); its upkeep (reaper, repair, outbox, "
                    "rebuild) waits for it",
                    name,
                    str(exc).strip(),
                )
            return
        except Exception:
            logger.exception("worker %s: %s failed; it runs again at its next interval", name, task)
            return
        if self._database_down_since is not None and database_answers():
            down = time.monotonic() - self._database_down_since
            self._database_down_since = None
            logger.warning("worker %s: database is back after %.1fs; upkeep resumes", name, down)
