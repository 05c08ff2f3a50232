"""The lane worker: RQ's SimpleWorker (registration, signals, dashboards) with a lean hot path.

Per job it makes one Redis round trip (finish the previous job and claim the next in one
script, lane.finish_and_claim) and one or two UPDATEs of the run record. Jobs run in-process; the README
explains why (measured: forking per job costs ~2x and a DB connection per job).
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from rq import Queue
from rq.exceptions import StopRequested
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker, WorkerStatus

from kumiko_jobs.conf import get_config, redis_description
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.db_connections import opened_connections
from kumiko_jobs.execution import run_claimed
from kumiko_jobs.lane import Claim, Finished, finish_and_claim, promote_due
from kumiko_jobs.leases import Heartbeat, reap
from kumiko_jobs.observability import flush_telemetry
from kumiko_jobs.outage import RedisOutage
from kumiko_jobs.rebuild import push_waiting, rebuild_step
from kumiko_jobs.repair import INTERVAL as REPAIR_INTERVAL
from kumiko_jobs.repair import repair_stale_runs
from kumiko_jobs.run_marker import RunningMarker

logger = logging.getLogger("kumiko_jobs.worker")
REAP_INTERVAL = 5.0
OUTBOX_INTERVAL = 2.0
REBUILD_INTERVAL = 1.0
MAX_BLOCK = 1.0


class LaneWorker(SimpleWorker):
    """Consumes exactly one lane (one RQ queue), so every pop is atomic and crash-safe."""

    def __init__(self, lane: str, *, name: str | None = None, schedule: bool = True, **kwargs: Any) -> None:
        self.lane = lane
        self.keys = get_keys()
        self.client = get_redis()
        self.schedule = schedule
        queue = Queue(self.keys.queue_name(lane), connection=self.client, serializer=JSONSerializer)
        super().__init__(
            [queue],
            connection=self.client,
            name=name or f"{self.keys.id_tag}-{lane}-{uuid.uuid4().hex[:10]}",
            serializer=JSONSerializer,
            worker_ttl=int(get_config()["ABANDON_AFTER"]),
            **kwargs,
        )
        self.counts: dict[str, int] = {}
        self._lease = float(get_config()["ABANDON_AFTER"])
        self._next_promote = 0.0
        self._next_reap = 0.0
        self._next_repair = time.time() + REPAIR_INTERVAL
        self._next_outbox = 0.0
        self._next_rebuild = 0.0
        self._heartbeat: Heartbeat | None = None

    # RQ calls request_stop on SIGTERM/SIGINT: finish the current job (BUSY) or stop at once.
    def work(  # type: ignore[override]
        self, burst: bool = False, max_jobs: int | None = None, logging_level: str = "INFO", **_: Any
    ) -> bool:
        self.bootstrap(logging_level)
        self._log_banner(burst, max_jobs)
        self.client.sadd(self.keys.claimers(self.lane), self.name)
        self._install_signal_handlers()  # type: ignore[no-untyped-call]
        self._heartbeat = Heartbeat(self.client, self.keys, self.lane, self.key)
        self._heartbeat.start()
        self._marker = RunningMarker(float(get_config()["RUNNING_MARK_DELAY"]))
        self._marker.start()
        try:
            self._loop(burst, max_jobs)
        except StopRequested:
            pass
        finally:
            # SIGTERM and --max-jobs end here: export the spans and metrics an SDK still holds
            # (first, so a lost Redis below cannot skip it).
            flush_telemetry()
            self._heartbeat.stop()
            self._marker.stop()
            try:
                self.client.srem(self.keys.claimers(self.lane), self.name)
                self.teardown()  # type: ignore[no-untyped-call]
            except redis.RedisError:
                logger.warning("worker %s: Redis unreachable while unregistering", self.name)
        done = sum(self.counts.values())
        logger.info(
            "worker %s stopped after %d jobs %s; database connections opened: %d",
            self.name,
            done,
            self.counts,
            opened_connections(),
        )
        return done > 0

    def request_stop(self, signum: int, frame: Any) -> None:
        logger.info(
            "worker %s: %s received: %s, then stopping (a second signal stops at once)",
            self.name,
            signal.Signals(signum).name,
            "finishing the running job" if self._state == WorkerStatus.BUSY else "no job running",
        )
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def _log_banner(self, burst: bool, max_jobs: int | None) -> None:
        from django.db import connection

        logger.info(
            "worker %s (pid %d) consuming lane %s (queue %s, prefix %r) on Redis %s, database %s; "
            "scheduler %s%s%s",
            self.name,
            os.getpid(),
            self.lane,
            self.keys.queue_name(self.lane),
            self.keys.prefix,
            redis_description(),
            f"{connection.vendor}:{connection.settings_dict.get('NAME')}",
            "on" if self.schedule else "off (--no-scheduler)",
            ", burst" if burst else "",
            f", at most {max_jobs} jobs" if max_jobs else "",
        )

    def _loop(self, burst: bool, max_jobs: int | None) -> int:
        heartbeat = self._heartbeat
        if heartbeat is None:
            raise RuntimeError("work() starts the heartbeat before the loop")
        done = 0
        finished: Finished | None = None  # the attempt whose outcome Redis is told next
        outage = RedisOutage(self.name)
        while True:
            stop = self._stop_requested or (max_jobs is not None and done >= max_jobs)
            execution_id = uuid.uuid4().hex[:12]
            self._state = WorkerStatus.BUSY  # a signal now only sets _stop_requested
            claim = None if stop else Claim(self.name, execution_id, time.time() + self._lease)
            try:
                self._upkeep()
                job = finish_and_claim(self.client, self.keys, self.lane, finished, claim)
                finished = None
                if job is None and not stop:
                    self._state = WorkerStatus.IDLE
                    if burst and self._nothing_due():
                        return done
                    self._wait_for_work()
                    continue
            except redis.RedisError as exc:
                # Redis restarting, failing over or refusing a script: keep the finished attempt
                # (its record is written) and try again with backoff, instead of dying.
                if stop and finished is None:
                    return done
                self._state = WorkerStatus.IDLE
                outage.wait(exc)
                continue
            outage.over()
            if stop or job is None:
                return done
            member = f"{job.job_id}:{execution_id}"
            heartbeat.member = member
            outcome = run_claimed(job, worker=self.name, consumer_lane=self.lane, observer=self._marker)
            heartbeat.member = ""
            self.counts[outcome.counted_as] = self.counts.get(outcome.counted_as, 0) + 1
            finished = Finished(job.job_id, member, outcome)
            if outcome.retry_at and self.schedule:
                # Wake for this run's own retry or deferral, not at the next promotion round.
                self._next_promote = min(self._next_promote, outcome.retry_at)
            done += 1

    def _wait_for_work(self) -> None:  # raises RedisError for the loop's backoff
        """Block on the lane's wake token (one key, not one per tenant); producers arm it."""
        timeout = max(0.05, min(MAX_BLOCK, self._next_promote - time.time())) if self.schedule else MAX_BLOCK
        self.client.blpop([self.keys.wake(self.lane)], timeout)

    def _upkeep(self) -> None:
        now = time.time()
        if self.schedule and now >= self._next_promote:
            next_due = promote_due(self.client, self.keys, self.lane)
            self._next_promote = min(now + MAX_BLOCK, next_due) if next_due else now + MAX_BLOCK
        if now >= self._next_reap:
            self._next_reap = now + REAP_INTERVAL
            self._guarded("reaper", reap, self.client, self.keys, self.lane, self.name)
        if now >= self._next_repair:
            self._next_repair = now + REPAIR_INTERVAL
            self._guarded("repair", repair_stale_runs, self.client, self.keys, self.lane)
        if now >= self._next_outbox:
            self._next_outbox = now + OUTBOX_INTERVAL
            self._guarded("outbox", push_waiting, self.client, self.keys, self.lane)
        if now >= self._next_rebuild:
            # A batch of a rebuild when Redis lost its data; one MGET otherwise.
            self._next_rebuild = now + REBUILD_INTERVAL
            self._guarded("rebuild", rebuild_step, self.client, self.keys, self.lane)

    def _guarded[**P](self, task: str, run: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> None:
        """Run an upkeep task; only a Redis outage (handled by the loop) gets past it."""
        try:
            run(*args, **kwargs)
        except redis.RedisError:
            raise
        except Exception:
            logger.exception("worker %s: %s failed; it runs again at its next interval", self.name, task)

    def _nothing_due(self) -> bool:
        if not self.schedule:
            return True
        next_due = promote_due(self.client, self.keys, self.lane)
        if next_due is not None and next_due <= time.time():
            return False
        # promote_due may have moved work into the lane; the next claim tells.
        return not self.client.exists(self.keys.ring(self.lane))
