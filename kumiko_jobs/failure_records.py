"""Every TenantFailure write (records.py holds the JobRun ones): a final failure inserts or
bumps the (tenant, job, subject) record in one atomic upsert, a success deletes it.

Both run through ``guarded_writes.safe`` from the outcome policy, so a failing write never
fails or retries a job.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from functools import cache

from django.db import connections, router

from kumiko_jobs.models import TenantFailure

_COLUMNS = (
    "tenant_id", "job_name", "subject", "message_key", "count",
    "first_failed_at", "last_failed_at", "last_run_id",
)  # fmt: skip


def record_tenant_failure(
    *, tenant_id: str, job_name: str, subject: str | None, message_key: str, run_id: str, now: datetime
) -> None:
    """Insert the (tenant, job, subject) failure record, or count one more failure on it.

    Concurrent final failures of the same key meet in the unique constraint, which the upsert
    names as its conflict target: one row, every failure counted.
    """
    alias = router.db_for_write(TenantFailure)
    connection = connections[alias]
    opts = TenantFailure._meta
    stamp = opts.get_field("last_failed_at").get_db_prep_value(now, connection)
    run = opts.get_field("last_run_id").get_db_prep_value(uuid.UUID(run_id), connection)
    with connection.cursor() as cursor:
        cursor.execute(
            _upsert_sql(alias, null_subject=subject is None),
            [tenant_id, job_name, subject, message_key, 1, stamp, stamp, run],
        )


def clear_tenant_failure(tenant_id: str, job_name: str, subject: str | None) -> None:
    """A success of the same (tenant, job, subject) deletes its failure record."""
    TenantFailure.objects.filter(tenant_id=tenant_id, job_name=job_name, subject=subject).delete()


@cache
def _upsert_sql(alias: str, *, null_subject: bool) -> str:
    quote = connections[alias].ops.quote_name
    table = quote(TenantFailure._meta.db_table)
    tenant, job, subject, key, count, _first, last, run = (quote(name) for name in _COLUMNS)
    # The conflict target is one of the two partial unique constraints (models.py); PostgreSQL
    # and SQLite both accept a partial index's predicate here.
    if null_subject:
        target = f"({tenant}, {job}) WHERE {subject} IS NULL"
    else:
        target = f"({tenant}, {job}, {subject}) WHERE {subject} IS NOT NULL"
    return (
        f"INSERT INTO {table} ({', '.join(quote(name) for name in _COLUMNS)}) "  # noqa: S608
        f"VALUES ({', '.join('%s' for _ in _COLUMNS)}) "
        f"ON CONFLICT {target} DO UPDATE SET {count} = {table}.{count} + 1, {key} = EXCLUDED.{key}, "
        f"{last} = EXCLUDED.{last}, {run} = EXCLUDED.{run}"
    )
