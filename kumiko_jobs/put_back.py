"""Outcomes that put a run back in its flow without using an attempt: a run over a cap lowered
since it was queued (cap_fallback.py), and a job this deploy does not know (a rolling deploy:
retried for a grace period, then failed). The outcome policy of an attempt is in outcomes.py.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from kumiko_jobs import attempt_records, guarded_writes, run_events
from kumiko_jobs.conf import get_config
from kumiko_jobs.definitions import JobDefinition
from kumiko_jobs.exceptions import StaleAttempt, UnknownJob
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.outcomes import LogLine, Outcome, failed_attempt, release_of, stale
from kumiko_jobs.scrubbing import scrub


def held_back(
    definition: JobDefinition,
    meta: JobMeta,
    start: attempt_records.Started,
    *,
    delay_ms: int,
    line: LogLine,
    cap_defers: int,
) -> Outcome:
    """Put the run back without an attempt (over a cap lowered since it was queued)."""
    next_meta = dataclasses.replace(meta, cap_defers=cap_defers)
    return _requeued(definition, meta, next_meta, start, delay_ms / 1000, line, "over_cap")


def unknown_job(meta: JobMeta, job_name: str, start: attempt_records.Started) -> Outcome:
    """A name this deploy does not know: retry for a grace period (rolling deploy), then fail."""
    job_id = start.job_id
    config = get_config()
    now = datetime.now(UTC)
    first_seen = meta.unknown_since or now.timestamp()
    if now.timestamp() - first_seen >= float(config["UNKNOWN_JOB_GRACE"]):
        return failed_attempt(None, job_id, meta, UnknownJob(job_name, []), [], start=start)
    delay = float(config["UNKNOWN_JOB_RETRY_DELAY"])
    message = scrub(
        f"Unknown job {job_name!r} on worker of this deploy; retrying in {delay:g}s "
        f"(gives up {config['UNKNOWN_JOB_GRACE']}s after first seen)."
    )
    line = {"t": now.isoformat(), "level": "warning", "msg": message, "attempt": meta.attempt}
    next_meta = dataclasses.replace(meta, unknown_since=first_seen)
    return _requeued(None, meta, next_meta, start, delay, line, "unknown_job", error=message)


def _requeued(
    definition: JobDefinition | None,
    meta: JobMeta,
    next_meta: JobMeta,
    start: attempt_records.Started,
    delay: float,
    line: LogLine,
    reason: str,
    *,
    error: str | None = None,
) -> Outcome:
    """Back to its flow after ``delay`` seconds without consuming an attempt."""
    now = datetime.now(UTC)
    next_at = now + timedelta(seconds=delay)
    try:
        guarded_writes.durable(
            attempt_records.mark_requeued, meta=meta, now=now, next_at=next_at, logs=[line], started=start
        )
    except StaleAttempt as moved:
        return stale(moved)
    run_events.attempt_ended(meta, start.job_id, "requeued", error=error, deferral=reason)
    return Outcome(
        "retry",
        "requeued",
        release_of(definition, meta),
        meta=next_meta.to_json(),
        retry_at=next_at.timestamp(),
    )
