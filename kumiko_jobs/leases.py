"""Leases of running jobs: the heartbeat that renews them, the reaper that retries runs whose
worker died (its lease expired)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from datetime import UTC, datetime

import redis
from rq.utils import utcformat

from kumiko_jobs import outcomes
from kumiko_jobs.conf import get_config
from kumiko_jobs.exceptions import KumikoJobsError, MalformedJob
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.keys import Keys
from kumiko_jobs.lane import Finished, finish_and_claim
from kumiko_jobs.registry import registry
from kumiko_jobs.scripts import HeartbeatArgs, TakeAbandonedArgs, argv, scripts_for

logger = logging.getLogger("kumiko_jobs")


class AbandonedJob(KumikoJobsError):
    """The worker running this job stopped heartbeating (killed, crashed or frozen)."""


def reap(client: redis.Redis, keys: Keys, lane: str, own_name: str) -> int:
    """Handle runs whose worker died: one reaper per lane at a time (short lock)."""
    if not client.set(keys.reaper_lock(lane), own_name, nx=True, px=4000):
        return 0
    now = time.time()
    # RQ only trims these registries in its own workers' maintenance; ours do it here.
    pipe = client.pipeline(transaction=False)
    pipe.zremrangebyscore(keys.finished(lane), "-inf", now)
    pipe.zremrangebyscore(keys.failed(lane), "-inf", now)
    pipe.execute()
    members = scripts_for(client).take_abandoned(
        keys=[keys.started(lane)], args=argv(TakeAbandonedArgs(now=now, limit=100))
    )
    for raw in members:
        job_id = raw.decode().split(":", 1)[0]
        _handle_abandoned(client, keys, lane, job_id)
    return len(members)


def _handle_abandoned(client: redis.Redis, keys: Keys, lane: str, job_id: str) -> None:
    meta_raw = client.hget(keys.job(job_id), "meta")
    if meta_raw is None:
        return
    try:
        meta = JobMeta.from_json(meta_raw)
    except MalformedJob:
        logger.error("kumiko_jobs: abandoned job %s has malformed meta; leaving it failed", job_id)
        return
    config = get_config()
    grant = 1 if meta.abandons < int(config["ABANDONED_RETRIES"]) else 0
    counted = dataclasses.replace(meta, abandons=meta.abandons + 1)
    error = AbandonedJob(
        f"the worker running attempt {meta.attempt} stopped heartbeating for "
        f"{config['ABANDON_AFTER']}s (killed or crashed)"
    )
    outcome = outcomes.failed_attempt(
        registry.find(meta.job_name), job_id, counted, error, [], extra_attempts=grant
    )
    finish_and_claim(client, keys, lane, Finished(job_id, "", outcome))
    logger.warning("kumiko_jobs: reaped abandoned job %s (%s): %s", job_id, meta.job_name, outcome.counted_as)


class Heartbeat(threading.Thread):
    """Keeps the worker key and the running job's lease alive while the handler runs."""

    def __init__(self, client: redis.Redis, keys: Keys, lane: str, worker_key: str) -> None:
        super().__init__(name="kumiko-heartbeat", daemon=True)
        self.client, self.keys, self.lane, self.worker_key = client, keys, lane, worker_key
        self.member = ""
        self._stop_event = threading.Event()

    def run(self) -> None:
        config = get_config()
        interval, ttl = float(config["HEARTBEAT_INTERVAL"]), int(config["ABANDON_AFTER"])
        script = scripts_for(self.client).heartbeat
        while not self._stop_event.wait(interval):
            args = HeartbeatArgs(
                member=self.member,
                deadline=time.time() + ttl,
                worker_ttl=ttl,
                now_iso=utcformat(datetime.now(UTC)),
            )
            try:
                script(keys=[self.keys.started(self.lane), self.worker_key], args=argv(args))
            except redis.RedisError:
                logger.warning("kumiko_jobs: heartbeat failed; retrying", exc_info=True)

    def stop(self) -> None:
        self._stop_event.set()
