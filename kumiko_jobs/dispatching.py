"""dispatch() and emit(): validate, record the run as queued (built by preparing.py), push it
to its lane, and make the run table agree with what Redis accepted.

Order of effects outside a transaction: the push and the row's INSERT are in flight together (a
worker that wins the race creates the row itself). On PostgreSQL the INSERT is sent first (it is
the longer wait), elsewhere the push; if the push fails, the row is deleted again, so Redis
being down leaves no row behind, and a crash between the two leaves a queued row that the
stale-run repair pushes from its record (repair.py). Inside ``transaction.atomic()`` the row is
written in the caller's transaction and the push happens on commit; a rollback leaves neither.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from django.db import router, transaction
from django.utils import timezone

from kumiko_jobs import faults, guarded_writes, records, run_events
from kumiko_jobs.conf import redis_description
from kumiko_jobs.definitions import EventTrigger
from kumiko_jobs.events import check_emitted
from kumiko_jobs.exceptions import QueueUnavailable, UnknownEvent
from kumiko_jobs.models import JobRun
from kumiko_jobs.preparing import prepare
from kumiko_jobs.pushing import PreparedJob, Pushed, push, push_overlapped
from kumiko_jobs.registry import registry
from kumiko_jobs.tenancy import normalise_tenant, user_id_of
from kumiko_jobs.validation import (
    MAX_CORRELATION_ID,
    MAX_TRIGGER_NAME,
    MAX_USER_ID,
    check_text_option,
    delay_seconds,
    validate_payload,
)

logger = logging.getLogger("kumiko_jobs")


@dataclass(frozen=True)
class DispatchResult:
    """What ``dispatch()`` did: ``status`` ``"queued"`` (with the ids) or ``"skipped"`` (with
    ``reason``, e.g. ``"max_per_tenant"``); a debounced dispatch reports the pending run's ids."""

    job_name: str
    status: Literal["queued", "skipped"]
    job_id: str | None = None
    run_id: str | None = None
    reason: str | None = None


def dispatch(
    name: str,
    payload: Mapping[str, Any] | None = None,
    *,
    tenant: Any = None,
    user: Any = None,
    correlation_id: str | None = None,
    trigger_name: str = "",
    delay: timedelta | float | None = None,
) -> DispatchResult:
    """Queue job ``name`` for ``tenant`` (a model instance or id), triggered by ``user``.

    Returns at once with the ids; inside ``transaction.atomic()`` the job reaches Redis on
    commit. Raises UnknownJob, InvalidPayload, InvalidTenant, InvalidDispatch or
    QueueUnavailable, before anything is written.
    """
    definition = registry.get(name)
    body = validate_payload(payload)
    prepared = prepare(
        definition,
        body,
        tenant_id=normalise_tenant(tenant),
        user_id=_user_id(user),
        correlation_id=_correlation_id(correlation_id),
        trigger_name=check_text_option("trigger_name", trigger_name, MAX_TRIGGER_NAME),
        delay=delay_seconds(delay),
    )
    return submit([prepared])[0]


def emit(
    event: str,
    payload: Mapping[str, Any] | None = None,
    *,
    tenant: Any = None,
    user: Any = None,
    correlation_id: str | None = None,
) -> list[DispatchResult]:
    """Dispatch every job whose ``on_event`` trigger matches ``event`` and its ``where`` filter.

    Raises UnknownEvent for a name outside ``KUMIKO_JOBS["EVENTS"]`` (when that is set); an
    event no job listens to is logged as a warning, once per name and process.
    """
    if not isinstance(event, str) or not event:
        raise UnknownEvent(f"emit() needs a non-empty event name, got {event!r}.")
    check_text_option("event", event, MAX_TRIGGER_NAME)
    body = validate_payload(payload)
    listeners = registry.for_event(event)
    check_emitted(event, listeners=len(listeners))
    tenant_id, user_id = normalise_tenant(tenant), _user_id(user)
    correlation_id = _correlation_id(correlation_id)
    prepared = [
        prepare(
            d, body, tenant_id=tenant_id, user_id=user_id, correlation_id=correlation_id, trigger_name=event
        )
        for d in listeners
        if any(isinstance(t, EventTrigger) and t.matches(event, body) for t in d.triggers)
    ]
    return submit(prepared)


def _user_id(user: Any) -> str | None:
    user_id = user_id_of(user)
    return None if user_id is None else check_text_option("user id", user_id, MAX_USER_ID)


def _correlation_id(correlation_id: str | None) -> str | None:
    if correlation_id is None:
        return None
    return check_text_option("correlation_id", correlation_id, MAX_CORRELATION_ID)


def submit(prepared: Sequence[PreparedJob]) -> list[DispatchResult]:
    """Push and record; inside a transaction, record now and push on commit."""
    if not prepared:
        return []
    using = router.db_for_write(JobRun)
    if transaction.get_connection(using).in_atomic_block:
        # The rows commit with the caller's data and wait for their push (pushed_at unset): if
        # the push never happens (a crash after COMMIT, Redis down), rebuild.push_waiting() pushes
        # them from their rows. Unique pushes, because both may try.
        waiting = [dataclasses.replace(p, unique=True) for p in prepared]
        for p in waiting:
            p.row.pushed_at = None
        records.insert_queued([p.row for p in waiting])
        transaction.on_commit(lambda: push_after_commit(waiting), using=using)
        return [DispatchResult(p.row.job_name, "queued", p.job_id, str(p.row.id)) for p in waiting]
    if len(prepared) == 1 and prepared[0].always_queued:
        return [_push_and_record_overlapped(prepared[0])]
    pushed = push(prepared)
    guarded_writes.safe(record_pushes, prepared, pushed, rows_exist=False)
    return [_result(p, o) for p, o in zip(prepared, pushed, strict=True)]


def _push_and_record_overlapped(p: PreparedJob) -> DispatchResult:
    """A job no gate can refuse: its row is written while Redis runs the push. If Redis fails
    after the row was written, the row is deleted again, so a QueueUnavailable still leaves
    nothing behind."""
    recorded = False

    def record() -> None:
        nonlocal recorded
        recorded = guarded_writes.safe(records.insert_queued, [p.row], after_push=True)  # pushed meanwhile

    # On PostgreSQL the INSERT goes out first and the push is built, sent and read while the
    # database works (its ~200 us per row is the longer wait); elsewhere the row is written
    # while Redis runs the push.
    inserted = records.start_insert_queued(p.row)
    try:
        if inserted is None:
            pushed = push_overlapped(p, record)
        else:
            try:
                pushed = push_overlapped(p, _nothing)
            finally:
                recorded = inserted()
    except QueueUnavailable:
        if recorded:
            guarded_writes.safe(records.delete_unpushed, p.row.id)
        raise
    if pushed.dropped:
        guarded_writes.safe(
            drop_replaced, pushed.dropped, now=timezone.now(), reason=f"replaced by {p.job_id}"
        )
    if recorded and pushed.status == "queued":
        run_events.queued([p.row])
    return _result(p, pushed)


def _nothing() -> None:
    pass


def drop_replaced(job_ids: Sequence[str], *, now: datetime, reason: str) -> None:
    """Runs a ``replace`` push took out of their flow: dropped, and said so."""
    run_events.dropped(records.mark_dropped(job_ids, now=now, reason=reason))


def _result(p: PreparedJob, pushed: Pushed) -> DispatchResult:
    if pushed.status == "skipped":
        return DispatchResult(p.row.job_name, "skipped", reason=pushed.reason)
    if pushed.status == "debounced" and pushed.pending_job_id:
        run_id = records.run_id_of(pushed.pending_job_id)
        return DispatchResult(
            p.row.job_name,
            "queued",
            pushed.pending_job_id,
            str(run_id) if run_id else None,
            reason="debounced",
        )
    return DispatchResult(p.row.job_name, "queued", p.job_id, str(p.row.id))


def record_pushes(
    prepared: Sequence[PreparedJob], outcomes: Sequence[Pushed], *, rows_exist: bool, announce: bool = True
) -> None:
    """Make the run table agree with what Redis accepted (and send job_queued for the new runs,
    unless ``announce`` is off: runs pushed again after Redis lost them were announced before)."""
    now = timezone.now()
    new_rows = [p.row for p, o in zip(prepared, outcomes, strict=True) if o.status == "queued"]
    if new_rows and not rows_exist:
        records.insert_queued(new_rows, after_push=True)
    record_gate_effects(prepared, outcomes, now=now)
    for p, o in zip(prepared, outcomes, strict=True):
        if rows_exist and o.status not in ("queued", "duplicate"):
            # Recorded before its push (inside the caller's transaction, or waiting for the
            # outbox), but a gate said no when it was pushed.
            reason = o.reason or o.status
            if o.newer_job_id:
                reason = f"replaced by a newer run ({o.newer_job_id})"
            records.mark_not_enqueued(p.row.id, now=now, reason=reason)
            run_events.dropped([p.row])
    if rows_exist:
        # "duplicate": pushed already (by rebuild.push_waiting, racing this commit).
        records.mark_pushed(
            [
                p.row.id
                for p, o in zip(prepared, outcomes, strict=True)
                if o.status in ("queued", "duplicate")
            ],
            now=now,
        )
    # Inside atomic() the rows were written with the caller's transaction and this runs after
    # its commit: a rolled-back dispatch never says it was queued.
    if announce:
        run_events.queued(p.row for p, o in zip(prepared, outcomes, strict=True) if o.status == "queued")


def record_gate_effects(
    prepared: Sequence[PreparedJob], outcomes: Sequence[Pushed], *, now: datetime
) -> None:
    """What the pushes' gates did to other runs: the waiting runs a ``replace`` push dropped,
    the pending run a ``debounce`` push merged into (its row takes the newest payload)."""
    for p, o in zip(prepared, outcomes, strict=True):
        if o.dropped:
            drop_replaced(o.dropped, now=now, reason=f"replaced by a newer run ({p.job_id})")
        if o.status == "debounced" and o.pending_job_id:
            records.merge_debounced(
                o.pending_job_id, payload=p.row.payload, next_attempt_at=p.row.next_attempt_at, now=now
            )


def push_after_commit(prepared: Sequence[PreparedJob]) -> None:
    """Push runs whose rows are committed; never raises into the caller's ``atomic()`` (Django
    would skip the transaction's remaining on_commit callbacks)."""
    faults.crash_point("dispatch:after_commit")
    try:
        pushed = push(prepared)
    except QueueUnavailable as exc:
        logger.warning(
            "kumiko_jobs: %d committed run(s) wait for Redis (%s: %s); a worker pushes them from "
            "their records when it answers again",
            len(prepared),
            redis_description(),
            exc.__cause__ or exc,
        )
        return
    except Exception:
        # Raised out of an on_commit callback, it would come out of the caller's atomic() after
        # the COMMIT and cancel the callbacks registered after it. The rows wait unpushed, and
        # the outbox pushes them (rebuild.push_waiting).
        logger.exception(
            "kumiko_jobs: pushing %d committed run(s) failed; the outbox pushes them", len(prepared)
        )
        return
    guarded_writes.safe(record_pushes, prepared, pushed, rows_exist=True)
