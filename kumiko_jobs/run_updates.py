"""One run's UPDATE by primary key, the hot path of every attempt's outcome, and its condition
(``AttemptGuard``): the statement text built once per set of columns, sent through libpq's
pipeline on PostgreSQL (pg_pipeline.py) or through a cursor with an asynchronous commit
(``execute``; records.py explains why run writes commit without waiting for the WAL flush).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper

from kumiko_jobs import pg_pipeline
from kumiko_jobs.models import ACTIVE_STATUSES, JobRun


def execute(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> int:
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
        if pg_pipeline.is_psycopg3():
            # psycopg 3 returns one result per statement: move to the UPDATE/INSERT one.
            # (psycopg2 keeps only the last one, and its nextset() raises NotSupportedError.)
            cursor.nextset()
        return int(cursor.rowcount)


@dataclass(frozen=True)
class AttemptGuard:
    """The condition of an attempt's own write (update_run): the run's record is at most at
    ``attempt``, and unfinished, or finished before ``started_at`` (when the attempt started; a
    run an operator requeued is finished in its record until the requeue marks it queued, which
    may come after a worker took it)."""

    attempt: int
    started_at: datetime | None = None


def update_run(run_id: str | uuid.UUID, *, guard: AttemptGuard | None = None, **values: Any) -> int:
    """UPDATE one run by primary key. The SQL text is built once per set of columns: the ORM's
    per-call query compilation cost as much as the statement itself on the worker's hot path.

    ``guard``: an attempt's own write, applied only while the run is still that attempt's. A
    worker that stalled past its lease (the reaper retried or failed the run, another worker may
    have finished it since) finds no row to change, instead of writing its outcome over the
    newer state (attempt_records.py)."""
    alias = router.db_for_write(JobRun)
    connection = connections[alias]
    if pg_pipeline.available(connection):
        statement = _update_statement(alias, run_id, values, guard)
        return pg_pipeline.send_all(connection, [statement]).wait()
    sql = _update_sql(alias, tuple(values), guard=_guard_kind(guard))
    params = [_FIELDS[name].get_db_prep_save(value, connection) for name, value in values.items()]
    params.append(_FIELDS["id"].get_db_prep_value(uuid.UUID(str(run_id)), connection))
    if guard is not None:
        params.append(guard.attempt)
        if guard.started_at is not None:
            params.append(_FIELDS["finished_at"].get_db_prep_value(guard.started_at, connection))
    return execute(connection, sql, params)


# A run, its values, and the guard of update_run (None: unguarded).
RunUpdate = tuple[str | uuid.UUID, dict[str, Any], AttemptGuard | None]


def update_runs(updates: Sequence[RunUpdate]) -> list[int] | None:
    """update_run for several runs in one round trip and one transaction (pg_pipeline): their
    row counts; None where pg_pipeline cannot take them (nothing was written). A database
    error is raised, and then none of them was written."""
    alias = router.db_for_write(JobRun)
    connection = connections[alias]
    if not pg_pipeline.available(connection):
        return None
    statements = [_update_statement(alias, run_id, values, up_to) for run_id, values, up_to in updates]
    return pg_pipeline.send_all(connection, statements).wait_all()


def _update_statement(
    alias: str, run_id: str | uuid.UUID, values: dict[str, Any], guard: AttemptGuard | None = None
) -> pg_pipeline.Statement:
    text_sql, converters = _update_text(alias, tuple(values), _guard_kind(guard))
    params = [convert(value) for convert, value in zip(converters, values.values(), strict=True)]
    # As text: PostgreSQL parses (and checks) the id, as it would a UUID's text.
    params.append(str(run_id).encode())
    if guard is not None:
        params.append(str(guard.attempt).encode())
        if guard.started_at is not None:
            params.append(pg_pipeline.text(guard.started_at))
    return text_sql, params


def _guard_kind(guard: AttemptGuard | None) -> str:
    """Which WHERE clause a guard needs: none, the attempt's, or with its start."""
    if guard is None:
        return ""
    return "attempt" if guard.started_at is None else "started"


_FIELDS = {field.name: field for field in JobRun._meta.concrete_fields}


@cache
def _update_sql(alias: str, names: tuple[str, ...], placeholders: str = "%s", *, guard: str = "") -> str:
    quote = connections[alias].ops.quote_name
    count = len(names) + 1 + {"": 0, "attempt": 1, "started": 2}[guard]
    marks = [f"${n}" for n in range(1, count + 1)] if placeholders == "$" else ["%s"] * count
    # Only column names of this model, quoted by the backend; every value is a parameter.
    assignments = ", ".join(
        f"{quote(str(_FIELDS[name].column))} = {mark}" for name, mark in zip(names, marks, strict=False)
    )
    table, pk = quote(JobRun._meta.db_table), quote(str(_FIELDS["id"].column))
    sql = f"UPDATE {table} SET {assignments} WHERE {pk} = {marks[len(names)]}"  # noqa: S608
    if guard:
        # The statuses are the model's constants, not input.
        active = ", ".join(f"'{status}'" for status in ACTIVE_STATUSES)
        status, attempt, finished_at = (
            quote(str(_FIELDS[name].column)) for name in ("status", "attempt", "finished_at")
        )
        unfinished = f"{status} IN ({active})"
        if guard == "started":
            unfinished = f"({unfinished} OR {finished_at} < {marks[-1]})"
        sql += f" AND {attempt} <= {marks[len(names) + 1]} AND {unfinished}"
    return sql


@cache
def _update_text(
    alias: str, names: tuple[str, ...], guard: str = ""
) -> tuple[bytes, tuple[pg_pipeline.Converter, ...]]:
    """update_run's statement for pg_pipeline: $n placeholders and a text converter per column
    (JSON columns encoded as their field encodes them)."""
    converters = tuple(
        pg_pipeline.json_text(getattr(_FIELDS[name], "encoder", None))
        if _FIELDS[name].get_internal_type() == "JSONField"
        else pg_pipeline.text
        for name in names
    )
    return _update_sql(alias, names, "$", guard=guard).encode(), converters
