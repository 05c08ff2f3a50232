"""Redis as a rebuildable copy of the run table: runs whose job Redis does not hold are pushed
again from their records (payload, tenant, attempt, schedule).

Three ways a recorded run can be missing from Redis, and who finds it:

- A run recorded in a caller's transaction whose push after commit never happened (the process
  died after COMMIT, or Redis was down): its row has no ``pushed_at``; ``push_waiting`` (every
  few seconds, per lane) pushes it from a tiny partial index.
- Redis lost its data (a restart without persistence, a failover to an empty replica): the
  ``<prefix>:epoch`` key is gone with it; the first worker of each lane to notice rebuilds
  the lane's queued and deferred runs, in batches between jobs (``rebuild_step``).
- One job hash vanished behind kumiko's back: stale-run repair (repair.py) finds its run
  unfinished and pushes it again without counting its limits twice.

Every push here is unique (a job id Redis holds is left alone), so these can race each other
and a late original push without running a job twice. A run Redis does not hold may also have
just finished, so it is pushed again only once its loss is confirmed (suspects.py). Delivery is
at least once: see README.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import redis
from django.db.models import Q, QuerySet
from rq.utils import as_text

from kumiko_jobs import faults, guarded_writes, keyset, records
from kumiko_jobs.conf import get_config
from kumiko_jobs.connection import get_keys
from kumiko_jobs.definitions import JobDefinition, wrapped_job
from kumiko_jobs.dispatching import record_pushes
from kumiko_jobs.gates import gates_for
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.keys import Keys
from kumiko_jobs.models import ACTIVE_STATUSES, JobRun, RunStatus
from kumiko_jobs.preparing import prepared_from_meta
from kumiko_jobs.pushing import PreparedJob, push
from kumiko_jobs.registry import registry
from kumiko_jobs.suspects import CONFIRM_AFTER, Suspects
from kumiko_jobs.task_jobs import on_run_lane

logger = logging.getLogger("kumiko_jobs")
BATCH = 500
# What a rebuild checks: the runs that wait in Redis (running ones are left to repair).
REBUILT_STATUSES = (RunStatus.QUEUED, RunStatus.DEFERRED)
# A run recorded inside a transaction gets this long for its own push after commit.
OUTBOX_GRACE = 5.0
ROW_FIELDS = (
    "id", "job_name", "tenant_id", "status", "attempt", "max_attempts", "lane", "job_id", "trigger_name",
    "triggered_by", "correlation_id", "payload", "next_attempt_at", "defer_count", "fanout_of",
    "retry_of", "updated_at", "pushed_at", "scheduled_at", "zone", "subject", "tenant_visible",
    "fanout_parent", "queued_at",
)  # fmt: skip


def owned_by(keys: Keys) -> Q:
    """Runs of this QUEUE_PREFIX that Redis holds: every job id it makes starts with its id tag
    (keys.py). A boot gate's run is not one: it runs inline, never in Redis, so repair, the
    outbox and a rebuild must not push it (it ran as a queued job beside the gate)."""
    return Q(job_id__startswith=f"{keys.id_tag}-") & ~Q(job_id__startswith=f"{keys.id_tag}-gate-")


def repush(client: redis.Redis, rows: Sequence[JobRun], *, admit: bool, announce: bool = False) -> int:
    """Push these runs again from their records; returns how many Redis took. ``admit=False``
    for runs whose skip limits Redis still counts (one hash lost, not the whole dataset);
    ``announce`` for runs never pushed before (the outbox), whose job_queued is still due."""
    prepared = [p for p in (_prepared(row, admit=admit) for row in rows) if p is not None]
    if not prepared:
        return 0
    pushed = push(prepared, client)
    faults.crash_point("rebuild:after_push")
    guarded_writes.safe(record_pushes, prepared, pushed, rows_exist=True, announce=announce)
    back = [p.row.id for p, o in zip(prepared, pushed, strict=True) if o.status == "queued"]
    guarded_writes.safe(records.mark_pushed_again, back, now=datetime.now(UTC))
    taken = sum(o.status in ("queued", "duplicate") for o in pushed)
    logger.warning("kumiko_jobs: pushed %d run(s) again from their records", taken)
    return taken


def _definition_of(job_name: str) -> JobDefinition | None:
    """The job a run of this name runs (a fan-out wrapper's: its job), as this process knows it:
    declared, or a Django task its resolver imports on first use."""
    return registry.find(wrapped_job(job_name) or job_name)


def _prepared(row: JobRun, *, admit: bool) -> PreparedJob | None:
    target = wrapped_job(row.job_name)
    definition = _definition_of(row.job_name)
    if definition is None:
        logger.warning("kumiko_jobs: run %s of undeclared job %r stays where it is", row.pk, row.job_name)
        return None
    definition = on_run_lane(definition, row.lane)
    gates = gates_for(definition, row.tenant_id, get_keys(), wrapper=target is not None)
    meta = JobMeta(
        run_id=str(row.pk),
        job_name=row.job_name,
        lane=definition.lane,
        tenant_id=row.tenant_id,
        triggered_by=row.triggered_by,
        trigger_name=row.trigger_name,
        correlation_id=row.correlation_id,
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        defers=row.defer_count,
        flow=gates.flow,
        limit_keys=gates.limit_keys,
        fanout_of=row.fanout_of,
        fanout_parent=row.fanout_parent,
        subject=row.subject,
        tenant_visible=row.tenant_visible,
        scheduled_at=row.scheduled_at.timestamp() if row.scheduled_at else None,
        zone=row.zone,
    )
    now = datetime.now(UTC)
    delay = (row.next_attempt_at - now).total_seconds() if row.next_attempt_at else 0.0
    return prepared_from_meta(
        definition,
        meta,
        gates,
        row.payload,
        job_id=row.job_id,
        delay=max(delay, 0.0),
        unique=True,
        retry_of=row.retry_of,
        admit=admit,
        queued_at=row.queued_at,
    )


def push_waiting(client: redis.Redis, keys: Keys, lane: str) -> int:
    """The outbox: push committed runs whose own push after commit did not happen (one query on
    a partial index that holds only such runs; usually empty). A run Redis holds was pushed and
    only its mark is missing; one it does not hold is pushed once that is confirmed. Returns
    how many runs it marked or pushed."""
    waiting = Q(pushed_at__isnull=True, status=RunStatus.QUEUED, lane=lane)
    suspects = Suspects(keys.suspects(lane, "outbox"), owned_by(keys) & waiting)
    cutoff = datetime.now(UTC) - timedelta(seconds=OUTBOX_GRACE)
    rows = _pushable(JobRun.objects.filter(owned_by(keys), waiting, queued_at__lt=cutoff))
    due = suspects.due(client, ROW_FIELDS)
    # One worker of the lane at a time (the pushes are unique either way).
    if not (rows or due.members) or not client.set(keys.outbox_lock(lane), "1", nx=True, px=2000):
        return 0
    done = repush(client, due.rows, admit=True, announce=True)
    suspects.forget(client, due)
    confirmed = {row.pk for row in due.rows}  # read again below, before their push
    rows = [row for row in rows if row.pk not in confirmed]
    missing = missing_from_redis(client, keys, rows)
    lost = {row.pk for row in missing}
    held = [row.pk for row in rows if row.pk not in lost]
    guarded_writes.safe(records.mark_pushed, held, now=datetime.now(UTC))
    suspects.note(client, missing)
    return done + len(held)


def _pushable(waiting: QuerySet[JobRun]) -> list[JobRun]:
    """The oldest BATCH waiting runs of jobs this process can push. A run of a job it does not
    know (removed, or a newer deploy's not here yet) would stay in the window for good, and
    once BATCH of them were there, every newer committed run waited behind them: their names
    are left out and the window read again (a query more per unknown name, in rounds that
    find one). A Django task imported only on first use is known: its resolver finds it."""
    unknown: set[str] = set()
    while True:
        rows = list(waiting.exclude(job_name__in=unknown).order_by("queued_at").only(*ROW_FIELDS)[:BATCH])
        found = {row.job_name for row in rows if _definition_of(row.job_name) is None}
        if not found:
            return rows
        unknown |= found


@dataclass
class RebuildState:
    """Where a lane's rebuild stands, kept in Redis so any worker of the lane can continue it."""

    epoch: str
    started: datetime
    status: str
    after: tuple[datetime, str] | None  # last (updated_at, pk) done

    def encode(self) -> str:
        after = f"{self.after[0].isoformat()}|{self.after[1]}" if self.after else ""
        return f"{self.epoch}|{self.started.isoformat()}|{self.status}|{after}"

    @classmethod
    def decode(cls, raw: bytes | str) -> RebuildState:
        epoch, started, status, *after = as_text(raw).split("|")
        mark = (datetime.fromisoformat(after[0]), after[1]) if after and after[0] else None
        return cls(epoch, datetime.fromisoformat(started), status, mark)


def rebuild_step(client: redis.Redis, keys: Keys, lane: str) -> int:
    """One batch of a lane's rebuild, if Redis lost its data since the lane was last rebuilt
    (the epoch key changed or vanished); returns how many runs were pushed. Cheap otherwise:
    one MGET."""
    epoch_raw, done_raw, state_raw = client.mget(keys.epoch, keys.rebuilt(lane), keys.rebuild_state(lane))
    if epoch_raw is None:
        client.set(keys.epoch, uuid.uuid4().hex, nx=True)
        epoch_raw = client.get(keys.epoch)
        if epoch_raw is None:
            return 0
    epoch = as_text(epoch_raw)
    if done_raw is not None and as_text(done_raw) == epoch:
        return 0
    if not client.set(keys.rebuild_lock(lane), "1", nx=True, px=30_000):
        return 0  # another worker of the lane is on it
    try:
        state = RebuildState.decode(state_raw) if state_raw else None
        if state is None or state.epoch != epoch:
            # Runs recorded from now on reach this Redis through their own push; older ones
            # may have been lost with the old dataset.
            state = RebuildState(epoch, datetime.now(UTC), RunStatus.QUEUED, None)
            client.set(keys.rebuild_state(lane), state.encode())
            logger.warning(
                "kumiko_jobs: no epoch for this Redis: it is new or lost its data; checking lane %s's "
                "unfinished runs against it",
                lane,
            )
        # Pushes in flight when the loss was noticed land or time out within REDIS_TIMEOUT:
        # wait that long, so a row whose push is still on its way is not pushed a second time.
        settle = timedelta(seconds=float(get_config()["REDIS_TIMEOUT"]) + 1)
        if datetime.now(UTC) < state.started + settle:
            return 0
        waiting = owned_by(keys) & Q(lane=lane, status__in=REBUILT_STATUSES)
        suspects = Suspects(keys.suspects(lane, "rebuild"), waiting)
        due = suspects.due(client, ROW_FIELDS)
        pushed = repush(client, missing_from_redis(client, keys, due.rows), admit=True)
        suspects.forget(client, due)
        if state.status:
            suspects.note(client, _rebuild_batch(client, keys, lane, state))
        if state.status == "" and not suspects.count(client):
            client.set(keys.rebuilt(lane), epoch)
            client.delete(keys.rebuild_state(lane))
            logger.warning("kumiko_jobs: lane %s checked: runs Redis had lost were pushed again", lane)
        else:
            client.set(keys.rebuild_state(lane), state.encode())
        return pushed
    finally:
        client.delete(keys.rebuild_lock(lane))


def _rebuild_batch(client: redis.Redis, keys: Keys, lane: str, state: RebuildState) -> list[JobRun]:
    """The next batch of the status being checked, and those of its runs Redis does not hold."""
    rows_query = JobRun.objects.filter(owned_by(keys), lane=lane, status=state.status)
    rows_query = rows_query.filter(updated_at__lt=state.started)
    if state.after:
        stamp, pk = state.after
        rows_query = keyset.after(rows_query, "updated_at", stamp, pk)
    rows = list(rows_query.order_by("updated_at", "pk").only(*ROW_FIELDS)[:BATCH])
    if len(rows) < BATCH:
        # This status is done: queued, then deferred; running runs are left to repair, which
        # waits for live workers' heartbeats to show who is still running what.
        state.status = RunStatus.DEFERRED if state.status == RunStatus.QUEUED else ""
        state.after = None
    else:
        state.after = (rows[-1].updated_at, str(rows[-1].pk))
    return missing_from_redis(client, keys, rows)


def missing_from_redis(client: redis.Redis, keys: Keys, rows: Sequence[JobRun]) -> list[JobRun]:
    pipe = client.pipeline(transaction=False)
    for row in rows:
        pipe.exists(keys.job(row.job_id))
    return [row for row, exists in zip(rows, pipe.execute(), strict=True) if not exists]


def running_on_a_live_worker(client: redis.Redis, keys: Keys, row: JobRun) -> bool:
    """A live worker refreshes its key every HEARTBEAT_INTERVAL, also after a Redis restart;
    its run finishes and records itself without Redis' copy of the job."""
    if row.status != RunStatus.RUNNING or not row.worker:
        return False
    return bool(client.exists(keys.worker(row.worker)))


@dataclass(frozen=True)
class RebuildReport:
    lane: str
    checked: int
    missing: int
    pushed: int


def rebuild_lane(client: redis.Redis, keys: Keys, lane: str, *, dry_run: bool = False) -> RebuildReport:
    """Check every unfinished run of the lane (this prefix) against Redis now, and push those
    Redis does not hold (``manage.py jobs rebuild``); runs on a live worker are left alone, and
    a run found missing is checked again CONFIRM_AFTER seconds later (suspects.py)."""
    checked = missing = pushed = 0
    # Limits are counted again only if Redis lost them with its data (no epoch, or one this lane
    # was not checked for); a hash lost alone left its limits counted.
    epoch, done = client.mget(keys.epoch, keys.rebuilt(lane))
    admit = epoch is None or epoch != done
    after: tuple[datetime, str] | None = None
    cutoff = datetime.now(UTC) - timedelta(seconds=float(get_config()["REDIS_TIMEOUT"]) + 1)
    active = owned_by(keys) & Q(lane=lane, status__in=ACTIVE_STATUSES)
    base = JobRun.objects.filter(active, updated_at__lt=cutoff)
    fields = (*ROW_FIELDS, "worker")
    # This command's own set: a dry run leaves nothing behind for the workers to push.
    suspects = Suspects(keys.suspects(lane, f"command-{uuid.uuid4().hex}"), active)
    try:
        while True:
            query = base
            if after:
                query = query.filter(Q(updated_at__gt=after[0]) | Q(updated_at=after[0], pk__gt=after[1]))
            rows = list(query.order_by("updated_at", "pk").only(*fields)[:BATCH])
            if not rows:
                break
            after = (rows[-1].updated_at, str(rows[-1].pk))
            checked += len(rows)
            suspects.note(client, lost_runs(client, keys, rows))
        if suspects.count(client):
            time.sleep(CONFIRM_AFTER)
        while (due := suspects.due(client, fields)).members:
            lost = lost_runs(client, keys, due.rows)
            missing += len(lost)
            if lost and not dry_run:
                pushed += repush(client, lost, admit=admit)
            suspects.forget(client, due)
    finally:
        client.delete(suspects.key)
    return RebuildReport(lane, checked, missing, pushed)


def lost_runs(client: redis.Redis, keys: Keys, rows: Sequence[JobRun]) -> list[JobRun]:
    """The rows whose job Redis does not hold, but for runs a live worker is running."""
    missing = missing_from_redis(client, keys, rows)
    return [row for row in missing if not running_on_a_live_worker(client, keys, row)]
