"""Lane upkeep shared by workers and drain(): promote due delayed jobs, reap dead workers' runs."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime

import redis
from rq.utils import utcformat

from kumiko_jobs.cap_fallback import current_flow_if_changed
from kumiko_jobs.conf import get_config
from kumiko_jobs.exceptions import KumikoJobsError, MalformedJob
from kumiko_jobs.execution import failed_attempt
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.keys import Keys
from kumiko_jobs.outcomes import Outcome
from kumiko_jobs.registry import registry
from kumiko_jobs.scripts import scripts_for

logger = logging.getLogger("kumiko_jobs")


class AbandonedJob(KumikoJobsError):
    """The worker running this job stopped heartbeating (killed, crashed or frozen)."""


def promote_due(client: redis.Redis, keys: Keys, lane: str, limit: int = 500) -> float | None:
    """Queue delayed jobs that are due (and sweep stock RQ pushes); return the next due time."""
    now = time.time()
    _count, next_due = scripts_for(client).promote(
        keys=[keys.scheduled(lane), keys.queue(lane)],
        args=[now, limit, utcformat(datetime.now(UTC)), keys.lane(lane)],
    )
    return float(next_due) if next_due is not None else None


def apply_outcome(
    client: redis.Redis,
    keys: Keys,
    lane: str,
    job_id: str,
    member: str,
    outcome: Outcome,
    *,
    worker: str = "",
    claim: bool = False,
    execution_id: str = "",
    deadline: float = 0.0,
) -> list[bytes] | None:
    """Tell Redis how an attempt ended and (optionally) claim the next job, in one round trip."""
    now = datetime.now(UTC)
    result = scripts_for(client).step(
        keys=[
            keys.started(lane),
            keys.finished(lane),
            keys.failed(lane),
            keys.scheduled(lane),
            keys.active,
            keys.queue(lane),
        ],
        args=[
            now.timestamp(),
            utcformat(now),
            worker,
            deadline,
            job_id,
            outcome.kind if job_id else "",
            member,
            outcome.ttl,
            outcome.retry_at,
            outcome.meta,
            outcome.exc_info,
            "1" if claim else "",
            execution_id,
            keys.lane(lane),
            outcome.flow,
            outcome.limit_keys,
            outcome.current_flow,
        ],
    )
    return result  # type: ignore[no-any-return]


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
    members = scripts_for(client).take_abandoned(keys=[keys.started(lane)], args=[now, 100])
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
    grant = 1 if meta.abandons < int(get_config()["ABANDONED_RETRIES"]) else 0
    meta.abandons += 1
    error = AbandonedJob(
        f"the worker running attempt {meta.attempt} stopped heartbeating for "
        f"{get_config()['ABANDON_AFTER']}s (killed or crashed)"
    )
    outcome = failed_attempt(registry.find(meta.job_name), job_id, meta, error, [], extra_attempts=grant)
    outcome.flow, outcome.limit_keys = meta.flow, meta.limit_keys
    outcome.current_flow = current_flow_if_changed(registry.find(meta.job_name), meta)
    apply_outcome(client, keys, lane, job_id, "", outcome)
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
            try:
                script(
                    keys=[self.keys.started(self.lane), self.worker_key],
                    args=[self.member, time.time() + ttl, ttl, utcformat(datetime.now(UTC))],
                )
            except redis.RedisError:
                logger.warning("kumiko_jobs: heartbeat failed; retrying", exc_info=True)

    def stop(self) -> None:
        self._stop_event.set()
