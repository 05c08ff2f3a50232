"""Every JobRun write. Each state change is one guarded UPDATE (or an insert that tolerates races).

This module holds the inserts and the writes of dispatching, pushing, repair and operators;
an attempt's own state changes, which the worker writes, are in attempt_records.py on top of
run_updates.py's guarded UPDATE.

Run records are a log that Redis can rebuild (workers upsert rows, the stale-run repair in
repair.py reconciles them), so the hot-path writes outside a caller's transaction are
committed without waiting for the WAL flush on PostgreSQL, in one round trip that applies the
setting to that statement's implicit transaction only: through libpq's pipeline where nothing
watches the connection's cursors (pg_pipeline.py), else ``SET LOCAL synchronous_commit TO OFF``
sent with the statement through a cursor. A caller's own transaction (dispatch inside
``atomic()``) keeps its durability.
"""

from __future__ import annotations

import logging
import operator
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from functools import reduce
from typing import Any

from django.db import DatabaseError, connections, router, transaction
from django.db.models import Q

from kumiko_jobs import pg_pipeline, run_rows
from kumiko_jobs.guarded_writes import safe
from kumiko_jobs.models import ACTIVE_STATUSES, FINISHED_STATUSES, JobRun, RunStatus
from kumiko_jobs.run_rows import RunRow
from kumiko_jobs.run_updates import execute

logger = logging.getLogger("kumiko_jobs")


def insert_queued(rows: Sequence[RunRow], *, after_push: bool = False) -> None:
    """Insert new runs' rows; a row a fast worker already created wins (ON CONFLICT DO NOTHING).
    ``after_push``: the runs are in Redis already (or being pushed), so a worker may have
    written some of these rows: one row found there gets the run's queue time back
    (keep_queue_time; a batch's keep the worker's), and a COPY takes the path that skips them
    at once (run_rows.Statement.copy)."""
    alias = router.db_for_write(JobRun)
    connection = connections[alias]
    statement = run_rows.statement(alias)
    if len(rows) == 1:  # every dispatch: one statement with an async commit, see run_updates.execute
        if pg_pipeline.available(connection):
            inserted = pg_pipeline.execute(connection, statement.text_sql, statement.text_params(rows[0]))
        else:
            inserted = execute(connection, statement.sql(), statement.params(rows[0]))
        if not inserted and after_push:
            keep_queue_time(rows[0])
        return
    own_transaction = not connection.in_atomic_block
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        if own_transaction and connection.vendor == "postgresql":
            cursor.execute("SET LOCAL synchronous_commit TO OFF")  # one commit for the batch
        if len(rows) >= run_rows.COPY_FROM and run_rows.can_copy(cursor):
            statement.copy(cursor, rows, after_push=after_push)
            return
        # Measured: one multi-row INSERT beats a pipelined executemany on PostgreSQL.
        for batch in run_rows.batches(rows):
            cursor.execute(statement.sql(len(batch)), [v for row in batch for v in statement.params(row)])


def start_insert_queued(row: RunRow) -> Callable[[], bool] | None:
    """Send one new run's INSERT without waiting (PostgreSQL, see pg_pipeline.py); returns the
    wait, True once the row is written. None: nothing was sent (another database, a transaction,
    instrumentation, or the send failed: logged), the caller inserts the usual way."""
    connection = connections[router.db_for_write(JobRun)]
    if not pg_pipeline.available(connection):
        return None
    statement = run_rows.statement(connection.alias)
    try:
        pending = pg_pipeline.send(connection, statement.text_sql, statement.text_params(row))
    except DatabaseError:
        logger.warning("kumiko_jobs: sending a run record failed; inserting it again", exc_info=True)
        return None

    def wait() -> bool:
        try:
            if not pending.wait():
                keep_queue_time(row)
        except DatabaseError:
            # A broken connection (replaced by wait) or a bad value: the usual insert says which,
            # and logs it; ON CONFLICT makes a second insert of a written row harmless.
            return safe(insert_queued, [row], after_push=True)
        return True

    return wait


def keep_queue_time(row: RunRow) -> None:
    """The row of a new run was there before its INSERT: a worker took the run first and created
    it, with its start as the queue time. The run was queued at ``row.queued_at`` (a Django
    task's ``enqueued_at`` says so too): moved back to it, never forward. Rare; no round trip
    otherwise."""
    JobRun.objects.filter(pk=row.id, queued_at__gt=row.queued_at).update(queued_at=row.queued_at)


def insert_claiming(rows: Sequence[RunRow]) -> set[str]:
    """Insert rows whose unique job id decides who acts on them (cron ticks); return the job ids
    this call inserted. Rows that exist are left alone. Committed durably: the row is the
    arbiter, not a log that Redis could rebuild."""
    alias = router.db_for_write(JobRun)
    connection = connections[alias]
    statement = run_rows.statement(alias)
    returning = run_rows.job_id_column(alias)
    inserted: set[str] = set()
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        for batch in run_rows.batches(rows):
            params = [v for row in batch for v in statement.params(row)]
            cursor.execute(statement.sql(len(batch), returning=returning), params)
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
    """A row written before its push (in the caller's transaction, or pushed late by the outbox)
    whose push a gate refused; only while it is still queued: a late push (the outbox, repair)
    may be refused because the run was pushed and ran meanwhile, and its outcome stays."""
    JobRun.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
        status=RunStatus.DROPPED, finished_at=now, updated_at=now, error=f"Not enqueued: {reason}"
    )


_DROPPED_FIELDS = ("id", "job_id", "job_name", "tenant_id", "attempt", "max_attempts", "lane")


def delete_runs(run_ids: Sequence[uuid.UUID]) -> int:
    """Retention: delete these finished runs (retention.py picks them, a batch at a time)."""
    deleted, _ = JobRun.objects.filter(pk__in=run_ids, status__in=FINISHED_STATUSES).delete()
    return deleted


def delete_unpushed(*run_ids: uuid.UUID) -> None:
    """Undo the rows of runs whose push failed, so QueueUnavailable leaves nothing behind."""
    JobRun.objects.filter(pk__in=run_ids, status=RunStatus.QUEUED).delete()


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
    """Which of these job ids have a run row (the fan-out's dedup). On PostgreSQL the ids go as
    one array parameter: ``IN`` with a placeholder per id cost 6-11 ms per 1,000 ids to build,
    bind and parse, ``= ANY(array)`` 2-3 ms (measured here; a third fewer Python calls per
    fan-out, whose wall time the COPY's wait bounds)."""
    ids = list(job_ids)
    # The database the rows are written to: a lagging replica would let a retry enqueue children
    # again.
    connection = connections[router.db_for_write(JobRun)]
    if connection.vendor != "postgresql":
        rows = JobRun.objects.using(connection.alias).filter(job_id__in=ids)
        return set(rows.values_list("job_id", flat=True))
    quote = connection.ops.quote_name
    sql = f"SELECT {quote('job_id')} FROM {quote(JobRun._meta.db_table)} WHERE {quote('job_id')} = ANY(%s)"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, [ids])
        return {row[0] for row in cursor.fetchall()}


def run_id_of(job_id: str) -> str | None:
    run_id = JobRun.objects.filter(job_id=job_id).values_list("pk", flat=True).first()
    return str(run_id) if run_id else None


def finish_times(job_ids: Iterable[str]) -> dict[str, datetime | None]:
    """Each run's ``finished_at`` (None: not finished), by job id, for ``mark_requeued_by_operator``."""
    return dict(JobRun.objects.filter(job_id__in=list(job_ids)).values_list("job_id", "finished_at"))


def retried_job_ids(job_ids: Iterable[str]) -> dict[str, str]:
    """Of these job ids, those whose run was retried by hand (retrying.py): job id -> the
    retry's run id. Two queries, the second on the partial index of ``retry_of``."""
    originals = dict(JobRun.objects.filter(job_id__in=list(job_ids)).values_list("pk", "job_id"))
    if not originals:
        return {}
    retries = JobRun.objects.filter(retry_of__in=list(originals)).values_list("retry_of", "pk")
    return {str(originals[original]): str(pk) for original, pk in retries if original is not None}


def mark_requeued_by_operator(
    job_ids: Iterable[str], *, now: datetime, finished_before: Mapping[str, datetime | None]
) -> None:
    """Runs an operator put back in their flows (django-rq's "requeue"): waiting again. Only
    rows whose ``finished_at`` is still what it was before the requeue (``finished_before``):
    a requeued run that a worker already ran again has its new outcome, which must stay."""
    unchanged = [
        Q(job_id=job_id, finished_at=finished_before[job_id])
        if finished_before[job_id] is not None
        else Q(job_id=job_id, finished_at__isnull=True)
        for job_id in job_ids
        if job_id in finished_before
    ]
    if not unchanged:
        return
    JobRun.objects.filter(reduce(operator.or_, unchanged)).exclude(status=RunStatus.RUNNING).update(
        status=RunStatus.QUEUED, finished_at=None, next_attempt_at=None, updated_at=now
    )


def unfinished_job_ids(job_ids: Sequence[str]) -> set[str]:
    """Of these job ids, those whose run record is not finished (queued, running, deferred)."""
    if not job_ids:
        return set()
    rows = JobRun.objects.filter(job_id__in=list(job_ids), status__in=ACTIVE_STATUSES)
    return set(rows.values_list("job_id", flat=True))


def status_of(run_id: str) -> str | None:
    """The run's recorded status (None without a row), from the database the run is written to
    (a lagging read replica would decide a write on an old status)."""
    runs = JobRun.objects.using(router.db_for_write(JobRun))
    return runs.filter(pk=run_id).values_list("status", flat=True).first()


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
