"""dispatch() and emit(): validate, record the run as queued, push it to its lane.

Order of effects: outside a transaction the job is pushed first and the queued row inserted
second (a worker that wins the race creates the row itself), so Redis being down leaves no
row behind. Inside ``transaction.atomic()`` the row is written in the caller's transaction
and the push happens on commit; a rollback leaves neither.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import redis
from django.db import router, transaction
from django.utils import timezone

from kumiko_jobs import records
from kumiko_jobs.conf import get_config, redis_url
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.definitions import EventTrigger, JobDefinition
from kumiko_jobs.exceptions import QueueUnavailable, UnknownEvent
from kumiko_jobs.jobdata import JobMeta, job_fields, validate_payload
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.observability import current_trace_carrier, current_correlation_id
from kumiko_jobs.registry import registry
from kumiko_jobs.scripts import scripts_for
from kumiko_jobs.tenancy import normalise_tenant, user_id_of

logger = logging.getLogger("kumiko_jobs")
PER_TENANT_PREFIX = "_per_tenant:"
_registered_queues: set[str] = set()


@dataclass(frozen=True)
class DispatchResult:
    job_name: str
    status: Literal["queued", "skipped"]
    job_id: str | None = None
    run_id: str | None = None
    reason: str | None = None


@dataclass
class PreparedJob:
    """One job ready to push: its hash fields, where it goes, and its run row."""

    job_id: str
    lane: str
    fields: list[Any]
    row: JobRun
    run_at: float = 0.0
    unique: bool = False


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
    commit. Raises UnknownJob, InvalidPayload, InvalidTenant or QueueUnavailable.
    """
    definition = registry.get(name)
    body = validate_payload(payload)
    prepared = prepare(
        definition, body, tenant_id=normalise_tenant(tenant), user_id=user_id_of(user),
        correlation_id=correlation_id, trigger_name=trigger_name, delay=delay,
    )  # fmt: skip
    submit([prepared])
    return DispatchResult(definition.name, "queued", prepared.job_id, str(prepared.row.id))


def emit(
    event: str, payload: Mapping[str, Any] | None = None, *, tenant: Any = None, user: Any = None,
    correlation_id: str | None = None,
) -> list[DispatchResult]:  # fmt: skip
    """Dispatch every job whose ``on_event`` trigger matches ``event`` and its ``where`` filter."""
    if not isinstance(event, str) or not event:
        raise UnknownEvent(f"emit() needs a non-empty event name, got {event!r}.")
    body = validate_payload(payload)
    tenant_id, user_id = normalise_tenant(tenant), user_id_of(user)
    prepared = [
        prepare(d, body, tenant_id=tenant_id, user_id=user_id, correlation_id=correlation_id, trigger_name=event)
        for d in registry.for_event(event)
        if any(isinstance(t, EventTrigger) and t.matches(event, body) for t in d.triggers)
    ]
    submit(prepared)
    return [DispatchResult(p.row.job_name, "queued", p.job_id, str(p.row.id)) for p in prepared]


def prepare(
    definition: JobDefinition, payload: Mapping[str, Any], *, tenant_id: str | None, user_id: str | None,
    correlation_id: str | None = None, trigger_name: str = "", delay: timedelta | float | None = None,
    job_id: str | None = None, unique: bool = False, run_id: uuid.UUID | None = None,
) -> PreparedJob:  # fmt: skip
    config = get_config()
    keys = get_keys()
    run_id = run_id or uuid.uuid4()
    now = timezone.now()
    job_name = (PER_TENANT_PREFIX + definition.name) if definition.per_tenant and tenant_id is None else definition.name
    meta = JobMeta(
        run_id=str(run_id), job_name=job_name, lane=definition.lane, tenant_id=tenant_id,
        triggered_by=user_id, trigger_name=trigger_name,
        correlation_id=correlation_id or current_correlation_id() or run_id.hex,
        attempt=1, max_attempts=definition.max_attempts, trace=current_trace_carrier(),
    )  # fmt: skip
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay or 0)
    run_at = now.timestamp() + seconds if seconds > 0 else 0.0
    jid = job_id or f"{keys.id_tag}-{run_id.hex}"
    fields = job_fields(
        queue_name=keys.queue_name(definition.lane), payload=payload, meta=meta, now=now,
        timeout=definition.timeout, result_ttl=int(config["RESULT_TTL"]), failure_ttl=int(config["FAILURE_TTL"]),
        status="scheduled" if run_at else "queued",
    )  # fmt: skip
    next_at = now + timedelta(seconds=seconds) if run_at else None
    row = records.new_run_row(meta=meta, job_id=jid, payload=payload, queued_at=now, next_attempt_at=next_at)
    return PreparedJob(job_id=jid, lane=definition.lane, fields=fields, row=row, run_at=run_at, unique=unique)


def submit(prepared: Sequence[PreparedJob]) -> list[bool]:
    """Push and record; inside a transaction, record now and push on commit."""
    if not prepared:
        return []
    using = router.db_for_write(JobRun)
    if transaction.get_connection(using).in_atomic_block:
        records.insert_queued([p.row for p in prepared])
        transaction.on_commit(lambda: _push_after_commit(prepared), using=using)
        return [True] * len(prepared)
    accepted = push(prepared)
    records.safe(records.insert_queued, [p.row for p, ok in zip(prepared, accepted, strict=True) if ok])
    return accepted


def push(prepared: Sequence[PreparedJob], client: redis.Redis | None = None) -> list[bool]:
    """Write the job hashes and queue them in one round trip. False = id existed (unique)."""
    client = client or get_redis()
    keys = get_keys()
    enqueue = scripts_for(client).enqueue
    try:
        _register_queues(client, {p.lane for p in prepared})
        if len(prepared) == 1:
            p = prepared[0]
            return [bool(enqueue(keys=_keys(p), args=_args(p), client=client))]
        pipe = client.pipeline(transaction=False)
        for p in prepared:
            enqueue(keys=_keys(p), args=_args(p), client=pipe)
        return [bool(r) for r in pipe.execute()]
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise QueueUnavailable(
            f"Redis at {redis_url()} did not answer within {get_config()['REDIS_TIMEOUT']}s ({exc}); "
            "nothing was enqueued or recorded. Check that Redis runs and KUMIKO_JOBS['REDIS_URL'] is right."
        ) from exc


def _push_after_commit(prepared: Sequence[PreparedJob]) -> None:
    try:
        push(prepared)
    except QueueUnavailable as exc:
        # The rows were committed with the caller's transaction; make the loss visible.
        now = timezone.now()
        JobRun.objects.filter(pk__in=[p.row.id for p in prepared]).update(
            status=RunStatus.FAILED, finished_at=now, updated_at=now, error=f"Never reached Redis: {exc}"
        )
        raise


def _keys(p: PreparedJob) -> list[str]:
    keys = get_keys()
    return [keys.job(p.job_id), keys.queue(p.lane), keys.scheduled(p.lane)]


def _args(p: PreparedJob) -> list[Any]:
    return ["1" if p.unique else "0", p.run_at, *p.fields]


def _register_queues(client: redis.Redis, lanes: set[str]) -> None:
    # RQ lists known queues in rq:queues; once per process is enough.
    keys = get_keys()
    missing = [keys.queue(lane) for lane in lanes if keys.queue(lane) not in _registered_queues]
    if missing:
        client.sadd("rq:queues", *missing)
        _registered_queues.update(missing)

