"""The lane step, the per-job hot path: finish the previous attempt and claim the next job in
one round trip (lua/finish_and_claim.lua), plus promotion of due delayed jobs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
from rq.utils import utcformat

from kumiko_jobs import script_calls
from kumiko_jobs.keys import Keys
from kumiko_jobs.outcome_counts import tally
from kumiko_jobs.outcomes import Outcome
from kumiko_jobs.scripts import NO_ENDING, Ending, FinishAndClaimArgs, PromoteArgs, argv, scripts_for


@dataclass(frozen=True)
class ClaimedJob:
    """A job a worker took from its lane: raw hash fields, decoded by execution.run_claimed."""

    job_id: str
    data: bytes
    meta_raw: bytes


@dataclass(frozen=True)
class Finished:
    """An attempt whose outcome Redis is to be told."""

    job_id: str
    member: str  # its lease member in the started registry ('' when already taken out)
    outcome: Outcome


@dataclass(frozen=True)
class Claim:
    """Who claims the next job, and the lease it gets."""

    worker: str
    execution_id: str
    deadline: float


def ending_of(outcome: Outcome) -> Ending:
    """An attempt's outcome as the finishing scripts take it."""
    release = outcome.release
    return Ending(
        kind=outcome.kind,
        ttl=outcome.ttl,
        retry_at=outcome.retry_at,
        meta=outcome.meta,
        exc_info=outcome.exc_info,
        flow=release.flow,
        limit_keys=release.limit_keys,
        current_flow=release.current_flow,
    )


def finish_and_claim(
    client: redis.Redis, keys: Keys, lane: str, finished: Finished | None = None, claim: Claim | None = None
) -> ClaimedJob | None:
    """Tell Redis how an attempt ended and/or claim the next job, in one round trip. The call
    also carries the process's tally of ended attempts when a flush is due (outcome_counts.py)."""
    now = datetime.now(UTC)
    if finished is not None:
        outcome = finished.outcome
        tally.add(lane, outcome.counted_as, outcome.job_name, outcome.tenant_id, now.timestamp())
    counts = tally.take(lane, force=claim is None)
    args = FinishAndClaimArgs(
        now=now.timestamp(),
        now_iso=utcformat(now),
        worker=claim.worker if claim else "",
        deadline=claim.deadline if claim else 0.0,
        job_id=finished.job_id if finished else "",
        member=finished.member if finished else "",
        claim="1" if claim else "",
        execution_id=claim.execution_id if claim else "",
        lane_prefix=keys.lane(lane),
        counts=len(counts) // 5,
    )
    ending = ending_of(finished.outcome) if finished else NO_ENDING
    try:
        raw = script_calls.call(
            client,
            scripts_for(client).finish_and_claim,
            [*keys.outcome_registries(lane), keys.queue(lane)],
            argv(args, *ending, *counts),
        )
    except redis.RedisError:
        tally.give_back(lane, counts)  # counted with the next call
        raise
    if not raw:
        return None
    return ClaimedJob(job_id=raw[0].decode(), data=raw[1], meta_raw=raw[2])


def promote_due(client: redis.Redis, keys: Keys, lane: str, limit: int = 500) -> float | None:
    """Queue delayed jobs that are due (and sweep stock RQ pushes); return the next due time."""
    now = time.time()
    args = PromoteArgs(
        now=now, limit=limit, now_iso=utcformat(datetime.now(UTC)), lane_prefix=keys.lane(lane)
    )
    _count, next_due = scripts_for(client).promote(
        keys=[keys.scheduled(lane), keys.queue(lane)], args=argv(args)
    )
    return float(next_due) if next_due is not None else None


def count_claims(client: redis.Redis, keys: Keys, lane: str, claimed: int) -> None:
    """Take ``claimed`` ids off the lane's queued count (see lua/common.lua: count_queued)."""
    if claimed:
        client.decrby(keys.queued_count(lane), claimed)
