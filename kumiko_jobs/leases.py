"""Leases of running jobs: the heartbeat that renews them, the reaper that retries runs whose
worker died (its lease expired)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import redis

from kumiko_jobs import faults, outcomes, records
from kumiko_jobs.conf import get_config
from kumiko_jobs.connection import get_keys
from kumiko_jobs.exceptions import KumikoJobsError, MalformedJob
from kumiko_jobs.gates import gates_for
from kumiko_jobs.jobdata import JobMeta, rq_time
from kumiko_jobs.keys import Keys, started_job_id
from kumiko_jobs.lane import ending_of
from kumiko_jobs.models import FINISHED_STATUSES
from kumiko_jobs.outcomes import Release
from kumiko_jobs.registry import registry
from kumiko_jobs.scripts import HeartbeatArgs, ReapArgs, argv, scripts_for

logger = logging.getLogger("kumiko_jobs")


# How long a reaper's lock lasts without renewal; each reaped run renews it.
REAPER_LOCK_MS = 4000


class AbandonedJob(KumikoJobsError):
    """The worker running this job stopped heartbeating (killed, crashed or frozen)."""


def reap(client: redis.Redis, keys: Keys, lane: str, own_name: str) -> int:
    """Handle runs whose worker died: one reaper per lane at a time (short lock). Returns how
    many runs it finished.

    Crash-safe at every step: a run's lease stays in the started registry until the reap script
    takes it out in the same atomic step that requeues or fails it, and the record is written
    before that step, so a reaper that dies anywhere leaves the run for the next reaper (which
    writes the same record again). A reaper writes a run's record only while it still holds the
    lock and the run's lease is still expired (lua/reaper_turn.lua).
    """
    lock = keys.reaper_lock(lane)
    if not client.set(lock, own_name, nx=True, px=REAPER_LOCK_MS):
        return 0
    now = time.time()
    # RQ only trims these registries in its own workers' maintenance; ours do it here.
    pipe = client.pipeline(transaction=False)
    pipe.zremrangebyscore(keys.finished(lane), "-inf", now)
    pipe.zremrangebyscore(keys.failed(lane), "-inf", now)
    pipe.zrangebyscore(keys.started(lane), "-inf", now, start=0, num=100)
    *_, members = pipe.execute()
    turn = scripts_for(client).reaper_turn
    reaped = 0
    for raw in members:
        # Each run's record is written only while this reaper holds the lock (renewed here) and
        # the run's lease is still expired: one round trip a reaped run, on this rare path.
        member = raw.decode()
        job_id = started_job_id(member)
        mine, *meta = turn(
            keys=[lock, keys.started(lane), keys.job(job_id)],
            args=[own_name, REAPER_LOCK_MS, member, time.time()],
        )
        if int(mine) < 0:
            logger.warning("kumiko_jobs: reaper %s lost its lock to another; it stops this pass", own_name)
            break
        if int(mine):
            reaped += _reap_one(client, keys, lane, member, meta[0] if meta else None)
    return reaped


def _reap_one(client: redis.Redis, keys: Keys, lane: str, member: str, meta_raw: bytes | None) -> int:
    job_id = started_job_id(member)
    job_name = "?"
    if meta_raw is None:
        # The job hash is gone (deleted, or lost): only its cap slot is given back here;
        # repair pushes the run again from its record.
        outcome = outcomes.Outcome("", "lost", Release(flow=_flow_from_record(job_id)))
    else:
        try:
            meta = JobMeta.from_json(meta_raw)
        except MalformedJob as exc:
            outcome = outcomes.malformed(job_id, None, exc)
        else:
            job_name = meta.job_name
            outcome = _outcome_of_abandoned(job_id, meta, meta_raw.decode())
    faults.crash_point("reap:after_record")
    args = ReapArgs(
        now=time.time(),
        now_iso=rq_time(datetime.now(UTC)),
        member=member,
        job_id=job_id,
        lane_prefix=keys.lane(lane),
    )
    script = scripts_for(client).reap
    reaped = int(script(keys=keys.outcome_registries(lane), args=argv(args, *ending_of(outcome))))
    if reaped:
        logger.warning("kumiko_jobs: reaped abandoned job %s (%s): %s", job_id, job_name, outcome.counted_as)
    return reaped


def _flow_from_record(job_id: str) -> str:
    """The flow a run whose hash is gone was claimed from, from its record and declaration."""
    run = records.run_of_job(job_id)
    definition = registry.find(run[0]) if run else None
    if run is None or definition is None:
        return ""
    return gates_for(definition, run[1], get_keys()).flow


def _outcome_of_abandoned(job_id: str, meta: JobMeta, meta_raw: str = "") -> outcomes.Outcome:
    definition = registry.find(meta.job_name)
    recorded = records.status_of(meta.run_id)
    if recorded in FINISHED_STATUSES:
        # The worker wrote the outcome, then died before telling Redis: tell it now, do not
        # run the job again.
        return outcomes.recorded_outcome(definition, meta, recorded)
    config = get_config()
    grant = 1 if meta.abandons < int(config["ABANDONED_RETRIES"]) else 0
    counted = dataclasses.replace(meta, abandons=meta.abandons + 1)
    error = AbandonedJob(
        f"the worker running attempt {meta.attempt} stopped heartbeating for "
        f"{config['ABANDON_AFTER']}s (killed or crashed)"
    )
    outcome = outcomes.failed_attempt(
        definition, job_id, counted, error, [], extra_attempts=grant, reaping=True
    )
    if outcome.kind != "stale":
        return outcome
    # The record changed since it was read above: the worker was alive after all (stalled, not
    # dead) and wrote its outcome meanwhile. Tell Redis what the record says.
    recorded = records.status_of(meta.run_id)
    if recorded in FINISHED_STATUSES:
        return outcomes.recorded_outcome(definition, meta, recorded)
    # Unfinished at a later attempt than Redis knows of: the lease is let go, its cap slot given
    # back and its hash (the one with this meta) deleted (lua/common.lua: finish), so the
    # stale-run repair pushes the run again from its record.
    return outcomes.Outcome("", "lost", outcomes.release_of(definition, meta), meta=meta_raw)


class Heartbeat(threading.Thread):
    """Keeps the worker key and the leases of its claimed jobs alive, from their claim until
    Redis is told how they ended (claiming.py)."""

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        lane: str,
        worker_key: str,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="kumiko-heartbeat", daemon=True)
        self.client, self.keys, self.lane, self.worker_key = client, keys, lane, worker_key
        # Called when the worker's key is gone (Redis lost its data): register again.
        self.on_lost = on_lost
        self._members: set[str] = set()
        self._lock = threading.Lock()
        self._stop_event = threading.Event()

    def hold(self, member: str) -> None:
        with self._lock:
            self._members.add(member)

    def release(self, member: str) -> None:
        """Stop renewing a lease (the run ended, or its thread is stuck: let the reaper have it)."""
        with self._lock:
            self._members.discard(member)

    def run(self) -> None:
        config = get_config()
        interval, ttl = float(config["HEARTBEAT_INTERVAL"]), int(config["ABANDON_AFTER"])
        script = scripts_for(self.client).heartbeat
        while not self._stop_event.wait(interval):
            args = HeartbeatArgs(
                deadline=time.time() + ttl, worker_ttl=ttl, now_iso=rq_time(datetime.now(UTC))
            )
            with self._lock:
                members = sorted(self._members)
            try:
                keys = [self.keys.started(self.lane), self.worker_key]
                known = script(keys=keys, args=argv(args, *members))
                if not known and self.on_lost is not None:
                    self.on_lost()
            except Exception:
                # Any error, not only Redis': a heartbeat thread that died would let the leases
                # of running jobs lapse, and the reaper would run them again beside them.
                logger.warning("kumiko_jobs: heartbeat failed; retrying", exc_info=True)

    def stop(self) -> None:
        self._stop_event.set()
