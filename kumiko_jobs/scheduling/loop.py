"""The scheduler thread of ``runjobs``: stamps, leader election, ticks, orphans, zone index.

Every process of a lane stamps the schedules it declares. Unless started with
``--no-scheduler`` it also competes for the lane's lease; the leader fires due ticks, removes
orphaned schedules and keeps the tenant zone index fresh (rebuilt in a helper thread, so a slow
TENANT_TIMEZONE never delays ticks). A clean stop hands the lease over at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable

import redis
from django.db import DatabaseError, close_old_connections, connections

from kumiko_jobs.conf import get_config
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.exceptions import QueueUnavailable
from kumiko_jobs.scheduling import registration, zones
from kumiko_jobs.scheduling.lease import FOLLOW_INTERVAL, RENEW_INTERVAL, LeaderLease
from kumiko_jobs.scheduling.planner import Planner
from kumiko_jobs.scheduling.specs import lane_schedules

logger = logging.getLogger("kumiko_jobs")
MAX_WAIT = 1.0
ZONE_CHECK_INTERVAL = 5.0
ERROR_BACKOFF = 2.0


class SchedulerThread(threading.Thread):
    def __init__(
        self, lane: str, owner: str, *, lead: bool = True, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(name=f"kumiko-scheduler-{lane}", daemon=True)
        self.lane, self.owner, self.lead, self.clock = lane, owner, lead, clock
        self.client, self.keys = get_redis(), get_keys()
        self.schedules = lane_schedules(lane)
        self.lease = LeaderLease(self.client, self.keys, lane, owner)
        self.planner = Planner(
            self.schedules, lease=self.lease, client=self.client, keys=self.keys, clock=clock
        )
        self.token: str | None = None
        self._stop_event = threading.Event()
        self._next = {"stamp": 0.0, "lease": 0.0, "orphans": 0.0, "zones": 0.0}
        self._rebuilding: threading.Thread | None = None
        self._has_local = any(s.tenant_local for s in self.schedules)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                try:
                    wait = self._iteration()
                except (redis.RedisError, QueueUnavailable, DatabaseError):
                    logger.warning(
                        "kumiko_jobs: scheduler of lane %s: error, retrying", self.lane, exc_info=True
                    )
                    close_old_connections()
                    wait = ERROR_BACKOFF
                except Exception:
                    # A bug must not silently end the lane's schedules: logged loudly, retried.
                    logger.exception("kumiko_jobs: scheduler of lane %s failed; retrying", self.lane)
                    close_old_connections()
                    wait = ERROR_BACKOFF
                self._stop_event.wait(min(wait, MAX_WAIT))
        finally:
            if self.token is not None:
                try:
                    self.lease.release(self.token)
                except redis.RedisError:
                    logger.warning("kumiko_jobs: could not release the scheduler lease; it expires")
            connections.close_all()

    def _due(self, what: str, interval: float) -> bool:
        now = time.monotonic()
        if now < self._next[what]:
            return False
        self._next[what] = now + interval
        return True

    def _iteration(self) -> float:
        config = get_config()
        grace = float(config["ORPHAN_GRACE"])
        if self._due("stamp", registration.seen_interval(grace)):
            registration.stamp_declared(self.client, self.keys, self.lane, self.schedules, self.clock())
        if not self.lead:
            return MAX_WAIT
        self._keep_lease()
        if self.token is None:
            return FOLLOW_INTERVAL
        if self._has_local and self._due("zones", ZONE_CHECK_INTERVAL):
            self._refresh_zones_if_stale(float(config["TENANT_ZONE_REFRESH"]))
            if not self.planner.sync_zones(self.token):
                return self._lost()
        wait = self.planner.step(self.token)
        if wait is None:
            return self._lost()
        if self._due("orphans", registration.seen_interval(grace)):
            registration.remove_orphans(self.client, self.keys, self.lane, self.clock(), grace)
        return wait

    def _keep_lease(self) -> None:
        if self.token is not None:
            if self._due("lease", RENEW_INTERVAL) and not self.lease.renew(self.token):
                self._lost()
            return
        if not self._due("lease", FOLLOW_INTERVAL):
            return
        token = self.lease.acquire()
        if token is None:
            return
        try:
            loaded = self.planner.load(token)
        except BaseException:
            # Held with no token kept, the lease would leave the lane without a leader until it
            # expires, again at every failed load. (Redis down made the load fail: the release
            # fails too, and the load's error is the one to see.)
            with contextlib.suppress(redis.RedisError):
                self.lease.release(token)
            raise
        if loaded:
            self.token = token
            self._next["lease"] = time.monotonic() + RENEW_INTERVAL
            self._next["zones"] = 0.0
            logger.info(
                "kumiko_jobs: %s leads the schedules of lane %s (lease %s)", self.owner, self.lane, token
            )

    def _lost(self) -> float:
        if self.token is not None:
            logger.warning("kumiko_jobs: %s lost the scheduler lease of lane %s", self.owner, self.lane)
        self.token = None
        return FOLLOW_INTERVAL

    def _refresh_zones_if_stale(self, max_age: float) -> None:
        if self._rebuilding is not None and self._rebuilding.is_alive():
            return
        found = zones.current_generation(self.client, self.keys)
        if found is not None and self.clock() - found[1] < max_age:
            return
        lock = f"{self.owner}:{uuid.uuid4().hex}"
        if not zones.try_rebuild_lock(self.client, self.keys, lock):
            return
        self._rebuilding = threading.Thread(
            target=self._rebuild, args=(lock,), name="kumiko-zone-index", daemon=True
        )
        self._rebuilding.start()

    def _rebuild(self, lock: str) -> None:
        try:
            zones.rebuild_zone_index(self.client, self.keys)
            self._next["zones"] = 0.0  # pick the new generation up at once
        except Exception:
            # A broken ACTIVE_TENANTS or TENANT_TIMEZONE must not stop the schedules; logged, retried.
            logger.exception("kumiko_jobs: rebuilding the tenant zone index failed")
        finally:
            zones.release_rebuild_lock(self.client, self.keys, lock)
            connections.close_all()
