"""Per-tenant fan-out: a wrapper run enqueues one child run per active tenant.

Children get deterministic job ids (wrapper id + tenant), and the dedup that keeps a wrapper
retry from enqueuing a tenant twice is the JobRun table's unique job id, not the presence of
a Redis hash, so it holds whatever Redis retention is configured.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from itertools import islice
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from kumiko_jobs import attempt_records, guarded_writes, outcomes, put_back, records, run_events, tenancy
from kumiko_jobs.definitions import Backoff, JobDefinition
from kumiko_jobs.dispatching import record_gate_effects
from kumiko_jobs.exceptions import QueueUnavailable
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.observability import current_trace_carrier
from kumiko_jobs.outcomes import Outcome
from kumiko_jobs.preparing import encode, prepare
from kumiko_jobs.pushing import PreparedJob, push, push_batch
from kumiko_jobs.registry import registry
from kumiko_jobs.run_marker import mark_running
from kumiko_jobs.run_rows import RunRow
from kumiko_jobs.scheduling.zones import tenants_in_zone

BATCH = 1000
_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,40}$")


def child_job_id(wrapper_job_id: str, tenant_id: str) -> str:
    part = (
        tenant_id
        if _SAFE_ID.match(tenant_id)
        else hashlib.sha1(tenant_id.encode(), usedforsecurity=False).hexdigest()[:20]
    )
    return f"{wrapper_job_id}-t-{part}"


def _batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


def run_fan_out(meta: JobMeta, start: attempt_records.Started, target: str) -> Outcome:
    """Enqueue one run of job ``target`` per active tenant for the wrapper run ``start.job_id``."""
    definition = registry.find(target)
    if definition is None:
        # A newer deploy's job reaching an older worker gets the same grace as any unknown job.
        return put_back.unknown_job(meta, target, start)
    job_id, payload = start.job_id, dict(start.payload)
    if not mark_running(meta, start):
        # The wrapper's run moved on while this worker stalled: fanning out again would queue a
        # second run per tenant.
        return Outcome("stale", "stale")
    try:
        reached: Counter[str] = Counter()
        # A tz="tenant" cron tick has one wrapper per zone: it reaches that zone's tenants only.
        if meta.zone:
            tenants: Iterable[str] = tenants_in_zone(meta.zone)  # listed ids already
        else:
            listed = (tenancy.listed_tenant_id(t) for t in tenancy.active_tenant_ids())
            tenants = (t for t in listed if t is not None)
        for batch in _batches(tenants, BATCH):
            reached += _enqueue_batch(definition, job_id, meta, payload, batch)
    except Exception as exc:
        return _failed_fan_out(definition, job_id, meta, exc, start)
    line = {
        "t": datetime.now(UTC).isoformat(),
        "level": "info",
        "msg": _fanned_out(reached),
        "attempt": meta.attempt,
    }
    # The runs this fan-out has: queued now or by an earlier attempt, not the tenants a gate
    # turned away (the log line says how many, and why).
    guarded_writes.safe(records.set_fanout_count, meta.run_id, reached["queued"] + reached[EARLIER])
    # The wrapper's own gates are a tenant flow: nothing of the target's to release.
    return outcomes.succeeded(None, job_id, meta, [line], None)


# A wrapper's own retry budget when its job has fewer attempts: a fan-out that failed midway
# (Redis or the database gone for a moment) left every later tenant without its run, and the
# children it did enqueue are skipped on the next attempt (their ids derive from the wrapper's).
WRAPPER_ATTEMPTS = 3
WRAPPER_BACKOFF = Backoff("exponential", delay_ms=1000)


def _failed_fan_out(
    definition: JobDefinition, job_id: str, meta: JobMeta, exc: Exception, start: attempt_records.Started
) -> Outcome:
    if isinstance(exc, ImproperlyConfigured):
        # No tenant source, or one a pooler breaks: another attempt soon finds the same. The
        # job's own policy applies.
        return outcomes.failed_attempt(definition, job_id, meta, exc, [], start=start)
    policy = definition if definition.backoff else dataclasses.replace(definition, backoff=WRAPPER_BACKOFF)
    extra = max(0, WRAPPER_ATTEMPTS - meta.max_attempts)
    return outcomes.failed_attempt(policy, job_id, meta, exc, [], extra_attempts=extra, start=start)


def spread_delay(definition: JobDefinition, tenant_id: str) -> float:
    """A tenant's fixed offset in [0, spread) seconds: the same tenant runs at the same point of
    every spread tick, and the children of one tick are spread evenly."""
    if not definition.spread:
        return 0.0
    digest = hashlib.sha1(f"{definition.name}|{tenant_id}".encode(), usedforsecurity=False).digest()
    return float(definition.spread) * int.from_bytes(digest[:4]) / 2**32


EARLIER = "queued by an earlier attempt"


def _fanned_out(reached: Counter[str]) -> str:
    """The wrapper's log line: its tenants, and what became of their runs where not all were
    queued now ("fanned out to 3 tenants: 2 queued, 1 skipped (max_per_tenant)")."""
    total = sum(reached.values())
    parts = [
        f"{count} {what}"
        for what, count in sorted(reached.items(), key=lambda item: (item[0] != "queued", item[0]))
        if count
    ]
    if reached["queued"] == total:
        return f"fanned out to {total} tenants"
    return f"fanned out to {total} tenants: " + ", ".join(parts)


def _enqueue_batch(
    definition: JobDefinition, wrapper_id: str, meta: JobMeta, payload: dict[str, Any], tenants: list[str]
) -> Counter[str]:
    """Queue the batch's children; count what became of each tenant's run: "queued", EARLIER,
    "merged into a pending run" (debounce) or "skipped (<reason>)" (a skip limit)."""
    # A retried wrapper derives its children's ids from the original's: tenants the original
    # reached are found in the run table and skipped. The zone wrappers of a tz="tenant" tick
    # derive them from the tick's id, so a tenant listed under two zones of one tick runs once.
    base = meta.fanout_of or wrapper_id
    ids = {tenant: child_job_id(base, tenant) for tenant in tenants}
    existing = records.recorded_job_ids(ids.values())
    encoded = encode(definition.name, payload)  # the same payload and trace for every child
    trace = current_trace_carrier()
    prepared: list[PreparedJob] = [
        prepare(
            definition,
            payload,
            tenant_id=tenant,
            user_id=meta.triggered_by,
            correlation_id=meta.correlation_id,
            trigger_name=meta.trigger_name,
            job_id=child_id,
            fanout_parent=base,
            unique=True,
            # Same id on every attempt, so a row recorded late matches what Redis holds.
            run_id=uuid.uuid5(uuid.NAMESPACE_URL, child_id),
            delay=spread_delay(definition, tenant),
            scheduled_at=meta.scheduled_at,
            encoded=encoded,
            trace=trace,
        )
        for tenant, child_id in ids.items()
        if child_id not in existing
    ]
    reached: Counter[str] = Counter({EARLIER: len(tenants) - len(prepared)})
    if not prepared:
        return reached
    gates = prepared[0].gates
    # The batch script knows skip limits but not replace/debounce or delays: those children go
    # one by one.
    batched = not (gates.replace or gates.debounce_key or definition.spread)
    if batched and not gates.limits:
        rows = _push_and_record(prepared)
        reached["queued"] += len(rows)
    else:
        pushed = push_batch(prepared) if batched else push(prepared)
        # Rows for every child not yet recorded, pushed now or by an attempt that crashed before
        # recording ("duplicate"): the unique job id makes this idempotent.
        rows = [p.row for p, o in zip(prepared, pushed, strict=True) if o.status in ("queued", "duplicate")]
        records.insert_queued(rows, after_push=True)
        # As dispatch records them: a replace child's dropped runs, a debounce child's merge.
        record_gate_effects(prepared, pushed, now=timezone.now())
        for outcome in pushed:
            if outcome.status in ("queued", "duplicate"):
                reached["queued"] += 1
            elif outcome.status == "debounced":
                reached["merged into a pending run"] += 1
            else:
                reached[f"skipped ({outcome.reason or outcome.status})"] += 1
    # A "duplicate" was pushed by an attempt that crashed before recording (and announcing) it.
    run_events.queued(rows)
    return reached


def _push_and_record(prepared: list[PreparedJob]) -> list[RunRow]:
    """Children no gate can refuse (each ends queued, or duplicate of an earlier attempt's
    push): their rows are written while Redis runs the push. If Redis fails after they were
    written they are deleted again, so the wrapper's retry finds them missing and pushes them."""
    rows = [p.row for p in prepared]
    recorded = False

    def record() -> None:
        nonlocal recorded
        records.insert_queued(rows)
        recorded = True

    try:
        push_batch(prepared, meanwhile=record)
    except QueueUnavailable:
        if recorded:
            records.delete_unpushed(*(row.id for row in rows))
        raise
    return rows
