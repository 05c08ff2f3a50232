"""Every JobRun write. Each state change is one guarded UPDATE (or an insert that tolerates races).

Workers write a state *before* telling Redis about it, so a crash in between leaves the run
registered in Redis and the reaper repairs the row; it never leaves a finished job with a row
that claims it is still running.

Run records are a log that Redis can rebuild (workers upsert rows, the stale-run repair in
repair.py reconciles them), so the hot-path writes outside a caller's transaction are
committed without waiting for the WAL flush on PostgreSQL: ``SET LOCAL synchronous_commit TO
OFF`` is sent with the statement in one round trip, so it applies to that implicit transaction
only. A caller's own transaction (dispatch inside ``atomic()``) keeps its durability.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError, connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from kumiko_jobs import db_connections
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.models import FINISHED_STATUSES, JobRun, RunStatus

logger = logging.getLogger("kumiko_jobs")

LogLine = dict[str, Any]


@dataclass(frozen=True)
class Started:
    """When and where an attempt started, for outcome writes that also record the start."""

    job_id: str
    payload: Mapping[str, Any]
    worker: str
    at: datetime
    # The start was recorded on its own and job_started sent (a run that lasted); short runs
    # get both with their outcome.
    announced: bool = False


def new_run_row(
    *,
    meta: JobMeta,
    job_id: str,
    payload: Mapping[str, Any],
    queued_at: datetime,
    status: str = RunStatus.QUEUED,
    next_attempt_at: datetime | None = None,
    retry_of: uuid.UUID | None = None,
) -> JobRun:
    return JobRun(
        id=uuid.UUID(meta.run_id),
        job_name=meta.job_name,
        tenant_id=meta.tenant_id,
        status=status,
        attempt=meta.attempt,
        max_attempts=meta.max_attempts,
        lane=meta.lane,
        job_id=job_id,
        trigger_name=meta.trigger_name,
        triggered_by=meta.triggered_by,
        correlation_id=meta.correlation_id,
        payload=dict(payload),
        queued_at=queued_at,
        next_attempt_at=next_attempt_at,
        updated_at=queued_at,
        retry_of=retry_of,
        fanout_of=meta.fanout_of,
        fanout_parent=meta.fanout_parent,
        subject=meta.subject,
        tenant_visible=meta.tenant_visible,
        scheduled_at=None if meta.scheduled_at is None else datetime.fromtimestamp(meta.scheduled_at, UTC),
        zone=meta.zone,
        # Every path but a dispatch inside atomic() records a run once it is in Redis (or while
        # its push is in flight); that one path clears this until its push after commit.
        pushed_at=queued_at,
    )


def insert_queued(rows: Sequence[JobRun]) -> None:
    """Insert queued rows; a row a fast worker already created wins (ON CONFLICT DO NOTHING)."""
    alias = router.db_for_write(JobRun)
    connection = connections[alias]
    params = [
        [field.get_db_prep_save(getattr(row, field.attname), connection) for field in _INSERT_FIELDS]
        for row in rows
    ]
    if len(params) == 1:  # every dispatch: precompiled SQL with an async commit, see _execute()
        _execute(connection, _insert_sql(alias), params[0])
        return
    own_transaction = not connection.in_atomic_block
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            cursor.executemany(_insert_sql(alias), params)
            return
        if own_transaction:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")  # one commit for the batch
        # Measured: one multi-row INSERT beats a pipelined executemany on PostgreSQL.
        JobRun.objects.using(alias).bulk_create(rows, ignore_conflicts=True)


def insert_claiming(rows: Sequence[JobRun]) -> set[str]:
    """Insert rows whose unique job id decides who acts on them (cron ticks); return the job ids
    this call inserted. Rows that exist are left alone. Committed durably: the row is the
    arbiter, not a log that Redis could rebuild."""
    alias = router.db_for_write(JobRun)
    connection = connections[alias]
    inserted: set[str] = set()
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        for start in range(0, len(rows), _CLAIM_BATCH):
            batch = rows[start : start + _CLAIM_BATCH]
            params = [
                field.get_db_prep_save(getattr(row, field.attname), connection)
                for row in batch
                for field in _INSERT_FIELDS
            ]
            cursor.execute(_claiming_sql(alias, len(batch)), params)
            inserted.update(str(job_id) for (job_id,) in cursor.fetchall())
    return inserted


def unpushed(job_ids: Iterable[str]) -> set[str]:
    """Of these job ids, those whose run was recorded before its push and is still waiting for
    it (``pushed_at`` unset: the pusher crashed or lost its lease in between)."""
    return set(
        JobRun.objects.filter(
            job_id__in=list(job_ids), status=RunStatus.QUEUED, pushed_at__isnull=True
        ).values_list("job_id", flat=True)
    )


def mark_running(
    *, meta: JobMeta, job_id: str, payload: Mapping[str, Any], worker: str, now: datetime
) -> None:
    values = {
        "status": RunStatus.RUNNING,
        "attempt": meta.attempt,
        "max_attempts": meta.max_attempts,
        "started_at": now,
        "finished_at": None,
        "next_attempt_at": None,
        "worker": worker,
        "updated_at": now,
    }
    if update_run(meta.run_id, **values):
        return
    # The dispatcher's insert has not landed (or failed): the run still gets its row. The insert
    # ignores a conflict on any unique column (the dispatcher's row may land in between, and it
    # conflicts on the job id as well as the key), and the UPDATE then applies either way.
    row = new_run_row(meta=meta, job_id=job_id, payload=payload, queued_at=now, status=RunStatus.RUNNING)
    insert_queued([row])
    update_run(meta.run_id, **values)


def mark_succeeded(
    *, meta: JobMeta, now: datetime, logs: list[LogLine], started: Started | None = None, result: Any = None
) -> None:
    """``result``: a Django task's JSON return value (None is the column's default, never written)."""
    values: dict[str, Any] = {} if result is None else {"result": result}
    _finish(
        meta,
        started,
        status=RunStatus.SUCCEEDED,
        finished_at=now,
        updated_at=now,
        logs=_all_logs(meta, logs),
        error="",
        traceback="",
        **values,
    )


def mark_retry(
    *,
    meta: JobMeta,
    now: datetime,
    next_at: datetime,
    error: str,
    traceback: str,
    logs: list[LogLine],
    next_attempt: int,
    max_attempts: int,
    started: Started | None = None,
) -> None:
    _finish(
        meta,
        started,
        status=RunStatus.QUEUED,
        attempt=next_attempt,
        max_attempts=max_attempts,
        next_attempt_at=next_at,
        updated_at=now,
        error=error,
        traceback=traceback,
        logs=_all_logs(meta, logs, force_merge=True),
    )


def mark_failed(
    *,
    meta: JobMeta,
    now: datetime,
    error: str,
    traceback: str,
    logs: list[LogLine],
    started: Started | None = None,
) -> None:
    _finish(
        meta,
        started,
        status=RunStatus.FAILED,
        finished_at=now,
        updated_at=now,
        next_attempt_at=None,
        error=error,
        traceback=traceback,
        logs=_all_logs(meta, logs, force_merge=True),
    )


def mark_deferred(
    *, meta: JobMeta, now: datetime, next_at: datetime, logs: list[LogLine], started: Started | None = None
) -> None:
    _finish(
        meta,
        started,
        status=RunStatus.DEFERRED,
        next_attempt_at=next_at,
        defer_count=meta.defers + 1,
        updated_at=now,
        logs=_all_logs(meta, logs, force_merge=True),
    )


def _finish(meta: JobMeta, started: Started | None, **values: Any) -> None:
    """Write an attempt's outcome. With ``started`` the row also gets the start (a worker may
    skip the separate "running" write for short runs), and is created if it is missing."""
    if started is not None:
        values.setdefault("attempt", meta.attempt)
        values = {
            "started_at": started.at,
            "worker": started.worker,
            "max_attempts": meta.max_attempts,
            **values,
        }
    if update_run(meta.run_id, **values) or started is None:
        return
    mark_running(
        meta=meta, job_id=started.job_id, payload=started.payload, worker=started.worker, now=started.at
    )
    update_run(meta.run_id, **values)


def mark_requeued(
    *,
    meta: JobMeta,
    now: datetime,
    next_at: datetime | None,
    logs: list[LogLine],
    started: Started | None = None,
) -> None:
    """Back to queued without consuming an attempt (unknown job during a deploy, a lowered cap).
    With ``started``, a row the dispatcher has not written yet is created first."""
    values = {
        "status": RunStatus.QUEUED,
        "next_attempt_at": next_at,
        "updated_at": now,
        "attempt": meta.attempt,
        "max_attempts": meta.max_attempts,
        "logs": _all_logs(meta, logs, force_merge=True),
    }
    if JobRun.objects.filter(pk=meta.run_id).update(**values) or started is None:
        return
    row = new_run_row(meta=meta, job_id=started.job_id, payload=started.payload, queued_at=now)
    insert_queued([row])
    JobRun.objects.filter(pk=meta.run_id).update(**values)


def mark_failed_without_row(*, job_id: str, run_id: str | None, now: datetime, error: str) -> None:
    """Malformed data: fail whatever row matches the job id or run id; log if none does."""
    query = JobRun.objects.filter(job_id=job_id)
    if run_id:
        try:
            query = JobRun.objects.filter(pk=uuid.UUID(run_id)) | query
        except ValueError:
            pass
    if not query.update(status=RunStatus.FAILED, finished_at=now, updated_at=now, error=error):
        logger.error("kumiko_jobs: malformed job %s has no run record: %s", job_id, error)


def _all_logs(meta: JobMeta, logs: list[LogLine], force_merge: bool = False) -> list[LogLine]:
    # Earlier attempts' lines are kept; reading them back only when there can be any keeps
    # the common first-attempt success to one UPDATE.
    if not force_merge and meta.attempt == 1 and meta.defers == 0 and meta.abandons == 0:
        return logs
    previous = JobRun.objects.filter(pk=meta.run_id).values_list("logs", flat=True).first()
    return [*(previous or []), *logs]


def _execute(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> int:
    """Execute one statement; on PostgreSQL outside a transaction, with an async commit."""
    prefix = (
        connection.vendor == "postgresql"
        and not connection.in_atomic_block
        # Two statements in one execute need client-side binding, Django's default for psycopg 3.
        and connection.settings_dict.get("OPTIONS", {}).get("server_side_binding") is not True
    )
    with connection.cursor() as cursor:
        if not prefix:
            cursor.execute(sql, params)
            return int(cursor.rowcount)
        cursor.execute("SET LOCAL synchronous_commit TO OFF; " + sql, params)
        # psycopg 3 returns one result per statement: move to the UPDATE/INSERT one.
        cursor.nextset()
        return int(cursor.rowcount)


def update_run(run_id: str | uuid.UUID, **values: Any) -> int:
    """UPDATE one run by primary key. The SQL text is built once per set of columns: the ORM's
    per-call query compilation cost as much as the statement itself on the worker's hot path."""
    alias = router.db_for_write(JobRun)
    connection = connections[alias]
    sql = _update_sql(alias, tuple(values))
    params = [_FIELDS[name].get_db_prep_save(value, connection) for name, value in values.items()]
    params.append(_FIELDS["id"].get_db_prep_value(uuid.UUID(str(run_id)), connection))
    return _execute(connection, sql, params)


_FIELDS = {field.name: field for field in JobRun._meta.concrete_fields}
_INSERT_FIELDS = tuple(JobRun._meta.concrete_fields)


@cache
def _insert_sql(alias: str) -> str:
    quote = connections[alias].ops.quote_name
    columns = ", ".join(quote(str(field.column)) for field in _INSERT_FIELDS)
    values = ", ".join("%s" for _ in _INSERT_FIELDS)
    # PostgreSQL and SQLite (>= 3.24) both know ON CONFLICT DO NOTHING.
    return f"INSERT INTO {quote(JobRun._meta.db_table)} ({columns}) VALUES ({values}) ON CONFLICT DO NOTHING"  # noqa: S608


_CLAIM_BATCH = 200  # rows per statement: SQLite allows 32,766 parameters


@cache
def _claiming_sql(alias: str, rows: int) -> str:
    quote = connections[alias].ops.quote_name
    columns = ", ".join(quote(str(field.column)) for field in _INSERT_FIELDS)
    row = "(" + ", ".join("%s" for _ in _INSERT_FIELDS) + ")"
    job_id = quote(str(_FIELDS["job_id"].column))
    return (
        f"INSERT INTO {quote(JobRun._meta.db_table)} ({columns}) VALUES {', '.join([row] * rows)} "  # noqa: S608
        f"ON CONFLICT DO NOTHING RETURNING {job_id}"
    )


@cache
def _update_sql(alias: str, names: tuple[str, ...]) -> str:
    quote = connections[alias].ops.quote_name
    # Only column names of this model, quoted by the backend; every value is a parameter.
    assignments = ", ".join(f"{quote(str(_FIELDS[name].column))} = %s" for name in names)
    table, pk = quote(JobRun._meta.db_table), quote(str(_FIELDS["id"].column))
    return f"UPDATE {table} SET {assignments} WHERE {pk} = %s"  # noqa: S608


def safe[**P](write: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> bool:
    """Run a record write; a failure is logged, never turned into a job failure or a dead worker.

    A connection that broke under the write (a job closed it, the database restarted) is
    replaced and the write tried once more: every write here is an idempotent UPDATE or upsert.
    """
    name = getattr(write, "__name__", repr(write))
    for attempt in (1, 2):
        try:
            write(*args, **kwargs)
        except (IntegrityError, DataError):
            logger.exception("kumiko_jobs: run record write %s failed", name)
        except DatabaseError:
            # Anything else may be a connection that broke under us (on SQLite a closed one
            # says ProgrammingError): a fresh connection gets one more try.
            connection = connections[router.db_for_write(JobRun)]
            if attempt == 1 and not connection.in_atomic_block:
                logger.warning("kumiko_jobs: run record write %s lost its connection; retrying", name)
                db_connections.discard(connection)
                continue
            logger.exception("kumiko_jobs: run record write %s failed", name)
        except Exception:
            # A bad value in a job's metadata must not stop the worker (poison job).
            logger.exception("kumiko_jobs: run record write %s failed", name)
        else:
            return True
        return False
    return False


def mark_dropped(
    job_ids: Iterable[str],
    *,
    now: datetime,
    reason: str,
    waiting: Sequence[str] = (RunStatus.QUEUED, RunStatus.DEFERRED),
) -> list[JobRun]:
    """Waiting runs that will never run (replaced, canceled); a run that started is left alone.
    Returns the dropped rows (the fields of ``run_events.DROPPED_FIELDS``), for job_dropped.
    Redis took them out of their flows first, so no worker starts them between read and update."""
    query = JobRun.objects.filter(job_id__in=list(job_ids), status__in=waiting)
    rows = list(query.only(*_DROPPED_FIELDS))
    if rows:
        JobRun.objects.filter(pk__in=[row.pk for row in rows], status__in=waiting).update(
            status=RunStatus.DROPPED, finished_at=now, updated_at=now, error=reason
        )
    return rows


def mark_not_enqueued(run_id: uuid.UUID, *, now: datetime, reason: str) -> None:
    """A row written in the caller's transaction whose push a gate refused at commit time."""
    JobRun.objects.filter(pk=run_id).update(
        status=RunStatus.DROPPED, finished_at=now, updated_at=now, error=f"Not enqueued at commit: {reason}"
    )


_DROPPED_FIELDS = ("id", "job_id", "job_name", "tenant_id", "attempt", "max_attempts", "lane")


def delete_runs(run_ids: Sequence[uuid.UUID]) -> int:
    """Retention: delete these finished runs (retention.py picks them, a batch at a time)."""
    deleted, _ = JobRun.objects.filter(pk__in=run_ids, status__in=FINISHED_STATUSES).delete()
    return deleted


def delete_unpushed(run_id: uuid.UUID) -> None:
    """Undo the row of a dispatch whose push failed, so QueueUnavailable leaves nothing behind."""
    JobRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).delete()


def merge_debounced(
    job_id: str, *, payload: Mapping[str, Any], next_attempt_at: datetime | None, now: datetime
) -> None:
    """A debounced dispatch merged into the pending run: it takes the newest payload."""
    JobRun.objects.filter(job_id=job_id).update(
        payload=dict(payload), next_attempt_at=next_attempt_at, updated_at=now
    )


def set_fanout_count(run_id: str, count: int) -> None:
    JobRun.objects.filter(pk=run_id).update(fanout_count=count)


def repair_status(run_id: uuid.UUID, *, expected: str, status: str, now: datetime, error: str) -> int:
    """Set a stale row to what Redis says became of its job, if nobody changed it meanwhile."""
    return JobRun.objects.filter(pk=run_id, status=expected).update(
        status=status, finished_at=now, updated_at=now, error=error
    )


def recorded_job_ids(job_ids: Iterable[str]) -> set[str]:
    """Which of these job ids have a run row (the fan-out's dedup)."""
    return set(JobRun.objects.filter(job_id__in=list(job_ids)).values_list("job_id", flat=True))


def run_id_of(job_id: str) -> str | None:
    run_id = JobRun.objects.filter(job_id=job_id).values_list("pk", flat=True).first()
    return str(run_id) if run_id else None


def mark_requeued_by_operator(job_ids: Iterable[str], *, now: datetime) -> None:
    """Runs an operator put back in their flows (django-rq's "requeue"): waiting again."""
    JobRun.objects.filter(job_id__in=list(job_ids)).exclude(status=RunStatus.RUNNING).update(
        status=RunStatus.QUEUED, finished_at=None, next_attempt_at=None, updated_at=now
    )


def status_of(run_id: str) -> str | None:
    """The run's recorded status (None without a row)."""
    return JobRun.objects.filter(pk=run_id).values_list("status", flat=True).first()


def mark_pushed(run_ids: Sequence[uuid.UUID | str], *, now: datetime) -> None:
    """Runs recorded before their push (inside a transaction) are in Redis now."""
    if run_ids:
        JobRun.objects.filter(pk__in=list(run_ids), pushed_at__isnull=True).update(pushed_at=now)


def run_of_job(job_id: str) -> tuple[str, str | None] | None:
    """(job name, tenant id) of the run recorded for this job id."""
    return JobRun.objects.filter(job_id=job_id).values_list("job_name", "tenant_id").first()


def mark_pushed_again(run_ids: Sequence[uuid.UUID | str], *, now: datetime) -> None:
    """Runs Redis had lost, pushed again from their records: a "running" one waits again (its
    worker is gone); the others keep their state."""
    if run_ids:
        JobRun.objects.filter(pk__in=list(run_ids), status=RunStatus.RUNNING).update(
            status=RunStatus.QUEUED, worker="", updated_at=now
        )
