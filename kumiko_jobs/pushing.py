"""Pushing prepared jobs into their lanes: one enqueue script call per job, or one per batch.

Redis errors become QueueUnavailable here; what the caller records about a push is
dispatching's business.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis
from django.utils import timezone
from redis.client import Pipeline
from redis.commands.core import Script

from kumiko_jobs import flows, script_calls
from kumiko_jobs.conf import get_config, redis_description
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.exceptions import QueueUnavailable
from kumiko_jobs.gates import Gates
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.keys import RQ_QUEUES
from kumiko_jobs.metrics import count_refused
from kumiko_jobs.observability import sending
from kumiko_jobs.run_rows import RunRow
from kumiko_jobs.scripts import EnqueueArgs, argv, scripts_for

_registered_queues: set[str] = set()
# What Redis answers a push with when it does not take it: no answer (a connection error, a
# timeout) or a refusal (READONLY from a replica after a failover, OOM under maxmemory with
# noeviction, NOREPLICAS, MISCONF after a failed save). Each becomes QueueUnavailable, so the
# caller hears one specific error and dispatch takes its row back. (redis.DataError, a bad
# argument, is a bug of ours and stays itself.)
REDIS_FAILURES = (redis.ConnectionError, redis.TimeoutError, redis.ResponseError)


@dataclass(slots=True)
class PreparedJob:
    """One job ready to push: its hash fields, where it goes, its gates and its run row. Treat
    it as immutable (``dataclasses.replace``); not ``frozen``, which costs every dispatch its
    fields' ``object.__setattr__`` calls (see JobMeta)."""

    job_id: str
    lane: str
    fields: list[Any]
    row: RunRow
    gates: Gates
    meta: JobMeta
    run_at: float = 0.0
    unique: bool = False
    # False: the run's skip limits are counted already (a job Redis lost behind kumiko's back
    # is pushed again from its record without counting it twice).
    admit: bool = True
    # Pushed from its record after the fact (the outbox, a rebuild): under concurrency="replace",
    # a newer run of its flow already waiting stays, and this one is dropped instead.
    late: bool = False

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
    # A late push refused as "replaced": the waiting run that replaced it.
    newer_job_id: str | None = None


def push(prepared: Sequence[PreparedJob], client: redis.Redis | None = None) -> list[Pushed]:
    """Write the job hashes and queue them through their gates, in one round trip."""
    client = client or get_redis()
    enqueue = scripts_for(client).enqueue
    now = timezone.now().timestamp()
    with sending(prepared) as send:
        jobs = send.jobs
        try:
            _register_queues(client, {p.lane for p in jobs})
            if len(jobs) == 1:
                raw = [enqueue(keys=_keys(jobs[0]), args=_args(jobs[0], now), client=client)]
            else:
                pipe = client.pipeline(transaction=False)
                for p in jobs:
                    enqueue(keys=_keys(p), args=_args(p, now), client=pipe)
                raw = pipe.execute()
        except REDIS_FAILURES as exc:
            raise unavailable(exc) from exc
        pushed = [_decode(p, r) for p, r in zip(jobs, raw, strict=True)]
        send.pushed(pushed)
    count_refused(jobs, pushed)
    return pushed


WATCH_ATTEMPTS = 5
Selection = Sequence[PreparedJob]


def push_watched(
    *,
    watch: str,
    select: Callable[[Pipeline], Selection | None],
    also: Callable[[Pipeline, Selection], None] | None = None,
    client: redis.Redis | None = None,
) -> tuple[Selection, list[Pushed]] | None:
    """Push what ``select`` picks while key ``watch`` is unchanged (an optimistic lock: WATCH,
    decide, MULTI, push, EXEC); ``also`` adds writes to the same transaction. ``select`` reads
    through the watching pipeline and returns the jobs to push, or None to push nothing (the
    result is then None). A change to ``watch`` before EXEC runs ``select`` again, so a push
    never happens under a decision that stopped holding. Returns (pushed jobs, outcomes)."""
    client = client or get_redis()
    enqueue = scripts_for(client).enqueue
    try:
        with client.pipeline(transaction=True) as pipe:
            for _ in range(WATCH_ATTEMPTS):
                try:
                    pipe.watch(watch)  # type: ignore[no-untyped-call]
                    chosen = select(pipe)
                    if chosen is None:
                        pipe.reset()
                        return None
                    _register_queues(client, {p.lane for p in chosen})
                    pipe.multi()
                    now = timezone.now().timestamp()
                    for p in chosen:
                        enqueue(keys=_keys(p), args=_args(p, now), client=pipe)
                    if also is not None:
                        also(pipe, chosen)
                    raw = pipe.execute()
                except redis.WatchError:
                    continue
                return chosen, [_decode(p, r) for p, r in zip(chosen, raw, strict=False)]
    except REDIS_FAILURES as exc:
        raise unavailable(exc) from exc
    raise QueueUnavailable(
        f"Key {watch!r} kept changing during {WATCH_ATTEMPTS} attempts to push; nothing was pushed. "
        "Retry; if it persists, something rewrites that key continuously."
    )


def push_overlapped(p: PreparedJob, meanwhile: Callable[[], object]) -> Pushed:
    """Send the enqueue script, run ``meanwhile`` (the row insert) while Redis works, then read
    Redis' answer: one round trip's wait instead of two. QueueUnavailable may come after
    ``meanwhile`` ran; the caller undoes what it did then."""
    with sending([p]) as send:
        pushed = _push_overlapped(send.jobs[0], meanwhile)
        send.pushed([pushed])
    count_refused([p], [pushed])
    return pushed


def _push_overlapped(p: PreparedJob, meanwhile: Callable[[], object]) -> Pushed:
    client = get_redis()
    keys, args = _keys(p), _args(p, timezone.now().timestamp())
    raw = _overlapped(client, scripts_for(client).enqueue, keys, args, {p.lane}, meanwhile)
    return _decode(p, raw)


def _overlapped(
    client: redis.Redis,
    script: Script,
    keys: list[str],
    args: list[Any],
    lanes: set[str],
    meanwhile: Callable[[], object],
) -> Any:
    """Send one script call, run ``meanwhile`` while Redis works, then read the reply."""
    pool = client.connection_pool
    try:
        _register_queues(client, lanes)
        connection = pool.get_connection()
    except REDIS_FAILURES as exc:
        raise unavailable(exc) from exc
    try:
        script_calls.send(connection, script, keys, args)
    except BaseException as exc:
        pool.release(connection)
        if isinstance(exc, REDIS_FAILURES):
            raise unavailable(exc) from exc
        raise
    try:
        meanwhile()
        try:
            raw = connection.read_response()
        except redis.exceptions.NoScriptError:
            # Not loaded on this server yet (nothing ran): the regular call loads and runs it.
            raw = script(keys=keys, args=args, client=client)
    except BaseException as exc:
        # The reply may still be in flight: never hand this socket to anyone else.
        connection.disconnect()  # type: ignore[no-untyped-call]
        if isinstance(exc, REDIS_FAILURES):
            raise unavailable(exc, sent=True) from exc
        raise
    finally:
        pool.release(connection)
    return raw


# Fields each fan-out child has of its own; every other field is shared by the batch.
_OWN_FIELDS = ("meta", "description", "kumiko_flow", "kumiko_lk")


def push_batch(
    prepared: Sequence[PreparedJob],
    client: redis.Redis | None = None,
    *,
    meanwhile: Callable[[], object] | None = None,
) -> list[Pushed]:
    """Queue jobs of one lane that share their payload and options (a fan-out's children) in one
    script call: the shared hash fields travel once, not once per job. No replace or debounce.
    ``meanwhile`` (recording the rows) runs while Redis works, as in ``push_overlapped``; it may
    have run when QueueUnavailable comes."""
    if not prepared:
        return []
    with sending(prepared) as send:
        pushed = _push_batch(send.jobs, client or get_redis(), meanwhile)
        send.pushed(pushed)
    count_refused(prepared, pushed)
    return pushed


def _push_batch(
    prepared: Sequence[PreparedJob], client: redis.Redis, meanwhile: Callable[[], object] | None
) -> list[Pushed]:
    first = dict(zip(prepared[0].fields[::2], prepared[0].fields[1::2], strict=True))
    shared = [item for key, value in first.items() if key not in _OWN_FIELDS for item in (key, value)]
    args: list[Any] = [get_keys().lane(prepared[0].lane), len(shared), *shared]
    for p in prepared:
        own = dict(zip(p.fields[::2], p.fields[1::2], strict=True))
        args += [
            p.job_id,
            own["meta"],
            own["description"],
            p.gates.flow,
            p.gates.limit_keys,
            flows.join_values(p.gates.limits),
        ]
    script, keys = scripts_for(client).enqueue_many, [get_keys().active]
    if meanwhile is not None:
        codes = _overlapped(client, script, keys, args, {prepared[0].lane}, meanwhile)
    else:
        try:
            _register_queues(client, {prepared[0].lane})
            codes = script(keys=keys, args=args, client=client)
        except REDIS_FAILURES as exc:
            raise unavailable(exc) from exc
    return [_decode_batch(p, code) for p, code in zip(prepared, codes, strict=True)]


def _decode_batch(p: PreparedJob, code: bytes) -> Pushed:
    if code == b"q":
        return Pushed("queued")
    if code == b"d":
        return Pushed("duplicate", reason="duplicate")
    # b"s<i>": refused by the job's i-th skip limit, which names the reason (max_per_tenant, ...).
    return Pushed("skipped", reason=p.gates.limits[int(code[1:]) - 1].reason)


def _decode(p: PreparedJob, raw: list[Any]) -> Pushed:
    code = raw[0].decode() if isinstance(raw[0], bytes) else str(raw[0])
    if code == "q":
        return Pushed("queued", dropped=tuple(x.decode() for x in raw[1:]))
    if code == "s":
        return Pushed("skipped", reason=p.gates.limits[int(raw[1]) - 1].reason)
    if code == "b":
        return Pushed("debounced", reason="debounced", pending_job_id=raw[1].decode())
    if code == "r":
        return Pushed("skipped", reason="replaced", newer_job_id=raw[1].decode())
    return Pushed("duplicate", reason="duplicate")


# By the refusal's error code (redis-py drops the READONLY and OOM prefixes from the message of
# its ReadOnlyError and OutOfMemoryError, so those are matched by class below).
_REFUSAL_HINTS = {
    "NOREPLICAS": " The primary has too few replicas in sync (min-replicas-to-write).",
    "MISCONF": " Redis cannot save its snapshot and refuses writes until it can: see its log.",
}


def redis_hint(exc: Exception) -> str:
    """What to do about Redis refusing a command or the credentials (a sentence with a leading
    space), or '' where there is nothing to say: the push's error and ``manage.py jobs``' say
    the same."""
    if isinstance(exc, redis.ReadOnlyError):
        return (
            " A replica answers so: after a failover, point KUMIKO_JOBS['REDIS'] at the primary or"
            " a Sentinel URL."
        )
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return " Redis is at its maxmemory under maxmemory-policy noeviction: give it memory."
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return (
            " The Redis user of KUMIKO_JOBS['REDIS'] may not run that command (ACL): allow it "
            "kumiko's keys and commands."
        )
    if isinstance(exc, redis.AuthenticationError):
        return " Check the user and password of KUMIKO_JOBS['REDIS'] (or env KUMIKO_REDIS_URL)."
    if isinstance(exc, redis.ResponseError):
        return _REFUSAL_HINTS.get(str(exc).split(" ", 1)[0], "")
    return ""


def unavailable(exc: Exception, *, sent: bool = False) -> QueueUnavailable:
    """QueueUnavailable for a Redis failure; ``sent``: it came after the command was sent, so a
    lost connection leaves open whether Redis ran it, as a timeout does."""
    where = f"Redis at {redis_description()}"
    if isinstance(exc, redis.ResponseError):
        return QueueUnavailable(
            f"{where} refused the push ({exc}); nothing was enqueued or recorded.{redis_hint(exc)}"
        )
    if isinstance(exc, redis.AuthenticationError):  # a ConnectionError, but Redis did answer
        return QueueUnavailable(
            f"{where} refused the credentials ({exc}); nothing was enqueued or recorded.{redis_hint(exc)}"
        )
    if isinstance(exc, redis.TimeoutError) or sent:
        # The command may have run, or still run when Redis recovers; then its worker records
        # and runs it.
        what = "the job was not recorded; if Redis ran the command or runs it later, the job runs then"
    else:
        what = "nothing was enqueued or recorded"
    return QueueUnavailable(
        f"{where} did not answer within {get_config()['REDIS_TIMEOUT']}s ({exc}); "
        f"{what}. Check that Redis runs and KUMIKO_JOBS['REDIS'] is right."
    )


def _keys(p: PreparedJob) -> list[str]:
    keys = get_keys()
    return [keys.job(p.job_id), keys.scheduled(p.lane), keys.active]


def _args(p: PreparedJob, now: float) -> list[Any]:
    g = p.gates
    args = EnqueueArgs(
        unique="1" if p.unique else "0",
        run_at=p.run_at,
        lane_prefix=get_keys().lane(p.lane),
        flow=g.flow,
        limit_keys=g.limit_keys if p.admit else "",
        limits=flows.join_values(g.limits) if p.admit else "",
        replace="1" if g.replace else "0",
        debounce_key=g.debounce_key,
        debounce_seconds=g.debounce_seconds,
        now=now,
        restore="" if p.admit else "1",
        late="1" if p.late else "0",
    )
    return argv(args, *p.fields)


def _register_queues(client: redis.Redis, lanes: set[str]) -> None:
    # RQ lists known queues in rq:queues; once per process is enough.
    keys = get_keys()
    missing = [keys.queue(lane) for lane in lanes if keys.queue(lane) not in _registered_queues]
    if missing:
        client.sadd(RQ_QUEUES, *missing)
        _registered_queues.update(missing)


def unregister_queues(client: redis.Redis, queues: Sequence[str]) -> None:
    """Take ``queues`` (``rq:queue:...`` keys) out of RQ's list of known queues, and out of this
    process's memory of having listed them, so that a later push lists them again."""
    if queues:
        client.srem(RQ_QUEUES, *queues)
        _registered_queues.difference_update(queues)
