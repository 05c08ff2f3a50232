"""The lane step, the per-job hot path: finish attempts and claim jobs in one round trip
(lua/finish_and_claim.lua), plus promotion of due delayed jobs. A one-thread worker finishes
its previous attempt and claims its next job in each step; in a --threads process the claimer
(claiming.py) makes the steps of all its job threads. Both make them through a ``Stepper``, on a
Redis connection of their own."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from kumiko_jobs import script_calls
from kumiko_jobs.jobdata import rq_time
from kumiko_jobs.keys import Keys
from kumiko_jobs.outcome_counts import tally
from kumiko_jobs.outcomes import Outcome
from kumiko_jobs.scripts import Ending, FinishAndClaimArgs, PromoteArgs, argv, scripts_for


@dataclass(frozen=True)
class ClaimedJob:
    """A job a worker took from its lane: raw hash fields, decoded by execution.run_claimed.
    ``execution_id``: the claim it was taken under, when a step sent again says (its claims may
    come back with gaps); else the claims' order tells."""

    job_id: str
    data: bytes
    meta_raw: bytes
    execution_id: str = ""


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
    """Tell Redis how an attempt ended and/or claim the next job, in one round trip."""
    jobs = step(client, keys, lane, [finished] if finished else [], [claim] if claim else [])
    return jobs[0] if jobs else None


def step(
    client: redis.Redis,
    keys: Keys,
    lane: str,
    finished: Sequence[Finished],
    claims: Sequence[Claim],
    *,
    connection: Any = None,
    again: bool = False,
) -> list[ClaimedJob]:
    """Tell Redis how attempts ended and claim up to ``len(claims)`` jobs, in one script call:
    the jobs claimed, in claim order (fewer when the lane ran dry). Claims are taken one after
    the other from the ring, as separate calls would take them, so fairness and caps are the
    same. All claims share one worker name and lease deadline (the latest). The call also
    carries the process's tally of ended attempts when a flush is due (outcome_counts.py).
    ``connection``: a connection of the caller's own (script_calls.call). ``again``: the same
    call once more, after an error left open whether it ran (FinishAndClaimArgs.again)."""
    now = datetime.now(UTC)
    stamp = now.timestamp()
    items: list[object] = []
    # A stale attempt's run moved on without it (outcomes.stale): Redis hears nothing of it.
    finished = [attempt for attempt in finished if attempt.outcome.kind != "stale"]
    for attempt in finished:
        outcome = attempt.outcome
        tally.add(lane, outcome.counted_as, outcome.job_name, outcome.tenant_id, stamp)
        items += (attempt.job_id, attempt.member, *ending_of(outcome))
    items += (claim.execution_id for claim in claims)
    # Not with a call sent again: if its first try ran, the script stops before the counts, and
    # these would be lost (they are flushed with the next call instead).
    counts = [] if again else tally.take(lane, force=not claims)
    args = FinishAndClaimArgs(
        now=stamp,
        now_iso=rq_time(now),
        worker=claims[0].worker if claims else "",
        deadline=max((claim.deadline for claim in claims), default=0.0),
        lane_prefix=keys.lane(lane),
        finished=len(finished),
        claims=len(claims),
        counts=len(counts) // 5,
        again=int(again),
    )
    rest = (*items, *counts)
    try:
        raw = script_calls.call(
            client,
            scripts_for(client).finish_and_claim,
            [*keys.outcome_registries(lane), keys.queue(lane)],
            argv(args, *rest),
            connection=connection,
            args_again=lambda: argv(args._replace(again=1), *rest),
        )
    except redis.RedisError:
        tally.give_back(lane, counts)  # counted with the next call
        # The caller sends these attempts again, and they are counted then: not twice.
        for attempt in finished:
            outcome = attempt.outcome
            tally.add(lane, outcome.counted_as, outcome.job_name, outcome.tenant_id, stamp, n=-1)
        raise
    if raw and raw[0] == b"again":  # the first try had run: its claims, each with its id
        return [
            ClaimedJob(
                job_id=raw[i].decode(), data=raw[i + 1], meta_raw=raw[i + 2], execution_id=raw[i + 3].decode()
            )
            for i in range(1, len(raw), 4)
        ]
    return [
        ClaimedJob(job_id=raw[i].decode(), data=raw[i + 1], meta_raw=raw[i + 2])
        for i in range(0, len(raw), 3)
    ]


class Stepper:
    """``step`` on a Redis connection taken from the pool once and kept by its one user (the job
    loop of a one-thread worker, the claimer of a --threads one): no pool lock, ``select()`` or
    redis-py's connection metrics per call (script_calls.call). Counts what its calls carried."""

    def __init__(self, client: redis.Redis, keys: Keys, lane: str) -> None:
        self.client, self.keys, self.lane = client, keys, lane
        self._connection: Any = None
        self.calls = 0
        self.carried = 0  # finishes and claims sent

    def step(
        self, finished: Sequence[Finished], claims: Sequence[Claim], *, again: bool = False
    ) -> list[ClaimedJob]:
        if self._connection is None:
            self._connection = self.client.connection_pool.get_connection()
        jobs = step(
            self.client, self.keys, self.lane, finished, claims, connection=self._connection, again=again
        )
        self.calls += 1
        self.carried += len(finished) + len(claims)
        return jobs

    def close(self) -> None:
        """Give the connection back to the pool (its user is done)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self.client.connection_pool.release(connection)


def promote_due(client: redis.Redis, keys: Keys, lane: str, limit: int = 500) -> float | None:
    """Queue delayed jobs that are due (and sweep stock RQ pushes); return the next due time."""
    now = time.time()
    args = PromoteArgs(now=now, limit=limit, now_iso=rq_time(datetime.now(UTC)), lane_prefix=keys.lane(lane))
    _count, next_due = scripts_for(client).promote(
        keys=[keys.scheduled(lane), keys.queue(lane)], args=argv(args)
    )
    return float(next_due) if next_due is not None else None


def count_claims(client: redis.Redis, keys: Keys, lane: str, claimed: int) -> None:
    """Take ``claimed`` ids off the lane's queued count (see lua/common.lua: count_queued)."""
    if claimed:
        client.decrby(keys.queued_count(lane), claimed)
