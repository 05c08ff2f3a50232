"""dispatch() and emit(): validate, record the run as queued, push it to its lane.

Order of effects: outside a transaction the job is pushed first and the queued row inserted
second (a worker that wins the race creates the row itself), so Redis being down leaves no
row behind. Inside ``transaction.atomic()`` the row is written in the caller's transaction
and the push happens on commit; a rollback leaves neither.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
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
from kumiko_jobs.gates import Gates, gates_for
from kumiko_jobs.jobdata import JobMeta, job_fields, validate_payload
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.observability import current_correlation_id, current_trace_carrier
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
    """One job ready to push: its hash fields, where it goes, its gates and its run row."""

    job_id: str
    lane: str
    fields: list[Any]
    row: JobRun
    gates: Gates
    run_at: float = 0.0
    unique: bool = False

    @property
    def always_queued(self) -> bool:
        """No gate can refuse it (no skip limit, debounce or unique id)."""
        return not (self.unique or self.gates.limits or self.gates.debounce_key)


@dataclass(frozen=True)
class Pushed:
    """What Redis said about one push."""

    status: Literal["queued", "duplicate", "skipped", "debounced"]
    reason: str | None = None
    dropped: tuple[str, ...] = ()
    pending_job_id: str | None = None


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
        definition,
        body,
        tenant_id=normalise_tenant(tenant),
        user_id=user_id_of(user),
        correlation_id=correlation_id,
        trigger_name=trigger_name,
        delay=delay,
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
    """Dispatch every job whose ``on_event`` trigger matches ``event`` and its ``where`` filter."""
    if not isinstance(event, str) or not event:
        raise UnknownEvent(f"emit() needs a non-empty event name, got {event!r}.")
    body = validate_payload(payload)
    tenant_id, user_id = normalise_tenant(tenant), user_id_of(user)
    prepared = [
        prepare(
            d, body, tenant_id=tenant_id, user_id=user_id, correlation_id=correlation_id, trigger_name=event
        )
        for d in registry.for_event(event)
        if any(isinstance(t, EventTrigger) and t.matches(event, body) for t in d.triggers)
    ]
    return submit(prepared)


def prepare(
    definition: JobDefinition,
    payload: Mapping[str, Any],
    *,
    tenant_id: str | None,
    user_id: str | None,
    correlation_id: str | None = None,
    trigger_name: str = "",
    delay: timedelta | float | None = None,
    job_id: str | None = None,
    unique: bool = False,
    run_id: uuid.UUID | None = None,
) -> PreparedJob:
    config = get_config()
    keys = get_keys()
    run_id = run_id or uuid.uuid4()
    now = timezone.now()
    wrapper = definition.per_tenant and tenant_id is None
    job_name = PER_TENANT_PREFIX + definition.name if wrapper else definition.name
    gates = gates_for(definition, tenant_id, keys, wrapper=wrapper)
    meta = JobMeta(
        run_id=str(run_id),
        job_name=job_name,
        lane=definition.lane,
        tenant_id=tenant_id,
        triggered_by=user_id,
        trigger_name=trigger_name,
        correlation_id=correlation_id or current_correlation_id() or run_id.hex,
        attempt=1,
        max_attempts=definition.max_attempts,
        trace=current_trace_carrier(),
        flow=gates.flow,
        limit_keys=gates.limit_keys,
    )
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay or 0)
    seconds = max(seconds, gates.debounce_seconds)
    run_at = now.timestamp() + seconds if seconds > 0 else 0.0
    jid = job_id or f"{keys.id_tag}-{run_id.hex}"
    fields = job_fields(
        queue_name=keys.queue_name(definition.lane),
        payload=payload,
        meta=meta,
        now=now,
        timeout=definition.timeout,
        result_ttl=int(config["RESULT_TTL"]),
        failure_ttl=int(config["FAILURE_TTL"]),
        status="scheduled" if run_at else "queued",
    )
    next_at = now + timedelta(seconds=seconds) if run_at else None
    row = records.new_run_row(meta=meta, job_id=jid, payload=payload, queued_at=now, next_attempt_at=next_at)
    return PreparedJob(
        job_id=jid, lane=definition.lane, fields=fields, row=row, gates=gates, run_at=run_at, unique=unique
    )


def submit(prepared: Sequence[PreparedJob]) -> list[DispatchResult]:
    """Push and record; inside a transaction, record now and push on commit."""
    if not prepared:
        return []
    using = router.db_for_write(JobRun)
    if transaction.get_connection(using).in_atomic_block:
        records.insert_queued([p.row for p in prepared])
        transaction.on_commit(lambda: _push_after_commit(prepared), using=using)
        return [DispatchResult(p.row.job_name, "queued", p.job_id, str(p.row.id)) for p in prepared]
    if len(prepared) == 1 and prepared[0].always_queued:
        return [_push_and_record_overlapped(prepared[0])]
    outcomes = push(prepared)
    records.safe(record_pushes, prepared, outcomes, rows_exist=False)
    return [_result(p, o) for p, o in zip(prepared, outcomes, strict=True)]


def _push_and_record_overlapped(p: PreparedJob) -> DispatchResult:
    """A job no gate can refuse: send the push, write the row while Redis works, then read
    Redis' answer -- one round trip's wait instead of two. If Redis fails after the row was
    written, the row is deleted again, so a QueueUnavailable still leaves nothing behind."""
    client = get_redis()
    try:
        _register_queues(client, {p.lane})
        answer = _send_enqueue(client, p)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise _unavailable(exc) from exc
    recorded = records.safe(records.insert_queued, [p.row])
    try:
        pushed = _decode(p, answer())
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        if recorded:
            JobRun.objects.filter(pk=p.row.id, status=RunStatus.QUEUED).delete()
        raise _unavailable(exc) from exc
    if pushed.dropped:
        records.safe(
            records.mark_dropped, pushed.dropped, now=timezone.now(), reason=f"replaced by {p.job_id}"
        )
    return _result(p, pushed)


def _send_enqueue(client: redis.Redis, p: PreparedJob) -> Callable[[], Any]:
    """Send the enqueue script on a pooled connection; the returned function reads the answer."""
    script = scripts_for(client).enqueue
    keys, args = _keys(p), _args(p, timezone.now().timestamp())
    pool = client.connection_pool
    connection = pool.get_connection()
    try:
        connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)  # type: ignore[no-untyped-call]
    except BaseException:
        pool.release(connection)
        raise

    def answer() -> Any:
        try:
            return connection.read_response()
        except redis.exceptions.NoScriptError:
            # Not loaded on this server yet (nothing ran): the regular call loads and runs it.
            return script(keys=keys, args=args, client=client)
        except BaseException:
            # The reply may still be in flight: never hand this socket to anyone else.
            connection.disconnect()  # type: ignore[no-untyped-call]
            raise
        finally:
            pool.release(connection)

    return answer


def _unavailable(exc: Exception) -> QueueUnavailable:
    if isinstance(exc, redis.TimeoutError):
        # The command may still run when Redis recovers; then its worker records and runs it.
        what = "the job was not recorded; if Redis runs the stalled command later, the job runs then"
    else:
        what = "nothing was enqueued or recorded"
    return QueueUnavailable(
        f"Redis at {redis_url()} did not answer within {get_config()['REDIS_TIMEOUT']}s ({exc}); "
        f"{what}. Check that Redis runs and KUMIKO_JOBS['REDIS_URL'] is right."
    )


def _result(p: PreparedJob, pushed: Pushed) -> DispatchResult:
    if pushed.status == "skipped":
        return DispatchResult(p.row.job_name, "skipped", reason=pushed.reason)
    if pushed.status == "debounced" and pushed.pending_job_id:
        run_id = JobRun.objects.filter(job_id=pushed.pending_job_id).values_list("pk", flat=True).first()
        return DispatchResult(
            p.row.job_name,
            "queued",
            pushed.pending_job_id,
            str(run_id) if run_id else None,
            reason="debounced",
        )
    return DispatchResult(p.row.job_name, "queued", p.job_id, str(p.row.id))


def record_pushes(prepared: Sequence[PreparedJob], outcomes: Sequence[Pushed], *, rows_exist: bool) -> None:
    """Make the run table agree with what Redis accepted."""
    now = timezone.now()
    new_rows = [p.row for p, o in zip(prepared, outcomes, strict=True) if o.status == "queued"]
    if new_rows and not rows_exist:
        records.insert_queued(new_rows)
    for p, o in zip(prepared, outcomes, strict=True):
        if o.dropped:
            records.mark_dropped(o.dropped, now=now, reason=f"replaced by a newer run ({p.job_id})")
        if o.status == "debounced" and o.pending_job_id:
            JobRun.objects.filter(job_id=o.pending_job_id).update(
                payload=p.row.payload, next_attempt_at=p.row.next_attempt_at, updated_at=now
            )
        if rows_exist and o.status != "queued":
            # Recorded inside the caller's transaction, but a gate said no at commit time.
            JobRun.objects.filter(pk=p.row.id).update(
                status=RunStatus.DROPPED,
                finished_at=now,
                updated_at=now,
                error=f"Not enqueued at commit: {o.reason or o.status}",
            )


def push(prepared: Sequence[PreparedJob], client: redis.Redis | None = None) -> list[Pushed]:
    """Write the job hashes and queue them through their gates, in one round trip."""
    client = client or get_redis()
    enqueue = scripts_for(client).enqueue
    now = timezone.now().timestamp()
    try:
        _register_queues(client, {p.lane for p in prepared})
        if len(prepared) == 1:
            p = prepared[0]
            raw = [enqueue(keys=_keys(p), args=_args(p, now), client=client)]
        else:
            pipe = client.pipeline(transaction=False)
            for p in prepared:
                enqueue(keys=_keys(p), args=_args(p, now), client=pipe)
            raw = pipe.execute()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise _unavailable(exc) from exc
    return [_decode(p, r) for p, r in zip(prepared, raw, strict=True)]


_OWN_FIELDS = ("meta", "description", "kumiko_flow", "kumiko_lk")


def push_batch(prepared: Sequence[PreparedJob], client: redis.Redis | None = None) -> list[Pushed]:
    """Queue jobs of one lane that share their payload and options (a fan-out's children) in one
    script call: the shared hash fields travel once, not once per job. No replace or debounce."""
    if not prepared:
        return []
    client = client or get_redis()
    first = dict(zip(prepared[0].fields[::2], prepared[0].fields[1::2], strict=True))
    shared = [item for key, value in first.items() if key not in _OWN_FIELDS for item in (key, value)]
    args: list[Any] = [get_keys().lane(prepared[0].lane), len(shared), *shared]
    for p in prepared:
        own = dict(zip(p.fields[::2], p.fields[1::2], strict=True))
        limits = "\n".join(str(limit) for _, limit, _ in p.gates.limits)
        args += [p.job_id, own["meta"], own["description"], p.gates.flow, p.gates.limit_keys, limits]
    try:
        _register_queues(client, {prepared[0].lane})
        codes = scripts_for(client).enqueue_many(keys=[get_keys().active], args=args, client=client)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise _unavailable(exc) from exc
    return [
        Pushed(_BATCH_STATUS[code], reason=None if code == b"q" else _BATCH_STATUS[code]) for code in codes
    ]


_BATCH_STATUS: dict[bytes, Literal["queued", "duplicate", "skipped"]] = {
    b"q": "queued",
    b"d": "duplicate",
    b"s": "skipped",
}


def _decode(p: PreparedJob, raw: list[Any]) -> Pushed:
    code = raw[0].decode() if isinstance(raw[0], bytes) else str(raw[0])
    if code == "q":
        return Pushed("queued", dropped=tuple(x.decode() for x in raw[1:]))
    if code == "s":
        return Pushed("skipped", reason=p.gates.limits[int(raw[1]) - 1][2])
    if code == "b":
        return Pushed("debounced", reason="debounced", pending_job_id=raw[1].decode())
    return Pushed("duplicate", reason="duplicate")


def _push_after_commit(prepared: Sequence[PreparedJob]) -> None:
    try:
        outcomes = push(prepared)
    except QueueUnavailable as exc:
        # The rows were committed with the caller's transaction; make the loss visible.
        now = timezone.now()
        JobRun.objects.filter(pk__in=[p.row.id for p in prepared]).update(
            status=RunStatus.FAILED, finished_at=now, updated_at=now, error=f"Never reached Redis: {exc}"
        )
        raise
    records.safe(record_pushes, prepared, outcomes, rows_exist=True)


def _keys(p: PreparedJob) -> list[str]:
    keys = get_keys()
    return [keys.job(p.job_id), keys.scheduled(p.lane), keys.active]


def _args(p: PreparedJob, now: float) -> list[Any]:
    g = p.gates
    return [
        "1" if p.unique else "0",
        p.run_at,
        get_keys().lane(p.lane),
        g.flow,
        g.limit_keys,
        "\n".join(str(limit) for _, limit, _ in g.limits),
        "1" if g.replace else "0",
        g.debounce_key,
        g.debounce_seconds,
        now,
        *p.fields,
    ]


def _register_queues(client: redis.Redis, lanes: set[str]) -> None:
    # RQ lists known queues in rq:queues; once per process is enough.
    keys = get_keys()
    missing = [keys.queue(lane) for lane in lanes if keys.queue(lane) not in _registered_queues]
    if missing:
        client.sadd("rq:queues", *missing)
        _registered_queues.update(missing)
