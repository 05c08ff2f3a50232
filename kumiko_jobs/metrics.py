"""Metrics through the OpenTelemetry metrics API, meter ``kumiko_jobs`` (DESIGN.md part 2).

| instrument | kind | unit | attributes |
| --- | --- | --- | --- |
| ``kumiko.jobs.depth`` | observable gauge | {job} | lane, state (queued, scheduled, running, failed) |
| ``kumiko.jobs.run.duration`` | histogram | s | job, outcome |
| ``kumiko.jobs.last_success`` | gauge | s (unix time) | job |
| ``kumiko.jobs.escape_hatch.uses`` | counter | {use} | job, kind |
| ``kumiko.jobs.refused`` | counter | {dispatch} | job, reason |
| ``kumiko.jobs.deferrals`` | counter | {deferral} | job, reason (handler, over_cap, unknown_job) |

Instruments are created once on the API's meter: without an SDK they are no-ops, and they
start recording when the application installs a MeterProvider (before or after this import).
Depth is read from Redis by one callback, when a reader collects: one pipelined round trip
of O(1) commands per lane, never per tenant.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import redis
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.definitions import LANES
from kumiko_jobs.keys import Keys

if TYPE_CHECKING:
    from kumiko_jobs.pushing import PreparedJob, Pushed

logger = logging.getLogger("kumiko_jobs")
meter = metrics.get_meter("kumiko_jobs")

DEPTH_STATES = ("queued", "scheduled", "running", "failed")
# Seconds: from a few milliseconds (most jobs) to ten minutes (exports, reports).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def lane_depths(client: redis.Redis, keys: Keys, lanes: Iterable[str] = LANES) -> dict[str, dict[str, int]]:
    """Per lane: queued (ids in its flows + stock RQ pushes not yet swept), scheduled (delayed,
    retrying, deferred), running (leased), failed (kept in RQ's failed registry). One round trip."""
    lanes = tuple(lanes)
    pipe = client.pipeline(transaction=False)
    for lane in lanes:
        pipe.get(keys.queued_count(lane))
        pipe.llen(keys.queue(lane))
        pipe.zcard(keys.scheduled(lane))
        pipe.zcard(keys.started(lane))
        pipe.zcard(keys.failed(lane))
    raw = pipe.execute()
    depths: dict[str, dict[str, int]] = {}
    for index, lane in enumerate(lanes):
        counted, plain, scheduled, running, failed = raw[index * 5 : index * 5 + 5]
        depths[lane] = {
            # The counter can be briefly off after keys were deleted by hand; never below 0.
            "queued": max(int(counted or 0), 0) + int(plain),
            "scheduled": int(scheduled),
            "running": int(running),
            "failed": int(failed),
        }
    return depths


def observe_depth(options: CallbackOptions) -> Iterator[Observation]:
    """The ``kumiko.jobs.depth`` callback. A Redis error skips this collection (logged)."""
    try:
        depths = lane_depths(get_redis(), get_keys())
    except redis.RedisError as exc:
        logger.warning("kumiko_jobs: queue depth not measured, Redis did not answer (%s)", exc)
        return
    for lane, states in depths.items():
        for state, value in states.items():
            yield Observation(value, {"lane": lane, "state": state})


depth = meter.create_observable_gauge(
    "kumiko.jobs.depth",
    callbacks=[observe_depth],
    unit="{job}",
    description="Jobs per lane and state (queued, scheduled, running, failed).",
)
run_duration = meter.create_histogram(
    "kumiko.jobs.run.duration",
    unit="s",
    description="Duration of one attempt, by job and outcome (succeeded, retried, failed, deferred).",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)
last_success = meter.create_gauge(
    "kumiko.jobs.last_success",
    unit="s",
    description="Unix time of the job's last successful run seen by this process.",
)
escape_hatch_uses = meter.create_counter(
    "kumiko.jobs.escape_hatch.uses",
    unit="{use}",
    description="Escape-hatch uses by job and kind, counted whether or not the audit was deduplicated.",
)
refused = meter.create_counter(
    "kumiko.jobs.refused",
    unit="{dispatch}",
    description="Dispatches a gate refused, by job and reason (e.g. max_per_tenant, concurrency).",
)
deferrals = meter.create_counter(
    "kumiko.jobs.deferrals",
    unit="{deferral}",
    description="Runs put back without using an attempt, by job and reason.",
)


# Second of each job's last stamp: a busy job stamps once a second, not once a run (alerts on
# the gauge think in minutes; an SDK spends microseconds per measurement).
_stamped: dict[str, int] = {}


def attempt_ended(job: str, outcome: str, duration: float | None, *, wrapper: bool = False) -> None:
    """Record a finished attempt: its duration, and the last success (not for fan-out wrappers:
    each tenant's child stamps the job instead)."""
    if duration is not None:
        run_duration.record(duration, {"job": job, "outcome": outcome})
    if outcome == "succeeded" and not wrapper:
        now = time.time()
        if _stamped.get(job) != int(now):
            _stamped[job] = int(now)
            last_success.set(now, {"job": job})


def count_refused(prepared: Sequence[PreparedJob], pushed: Sequence[Pushed]) -> None:
    for p, outcome in zip(prepared, pushed, strict=True):
        if outcome.status == "skipped":
            refused.add(1, {"job": p.meta.job_name, "reason": outcome.reason or "skipped"})
