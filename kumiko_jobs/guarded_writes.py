"""How a run record write fails without failing a job or killing a worker: ``safe`` logs the
failure and goes on; ``durable``, for a run's outcome in a worker, first waits out a database
that does not answer at all, so Redis never hears of an outcome the record lacks.

Both give a write one more try on a fresh connection when the first failed with a database
error that may be a connection broken under it (every record write is an idempotent UPDATE or
upsert; an attempt's guarded write that finds its own first try committed counts as written,
attempt_records._written_already). The writes themselves are in records.py and
attempt_records.py. An attempt's write that finds its run moved on raises StaleAttempt through
both: nothing failed, and the caller must not go on as if its outcome were recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError, connections, router

from kumiko_jobs import db_connections
from kumiko_jobs.exceptions import StaleAttempt
from kumiko_jobs.models import JobRun
from kumiko_jobs.outage import Outage

logger = logging.getLogger("kumiko_jobs")


def safe[**P](write: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> bool:
    """Run a record write; a failure is logged, never turned into a job failure or a dead worker.

    A connection that broke under the write (a job closed it, the database restarted) is
    replaced and the write tried once more: every write here is an idempotent UPDATE or upsert.
    """
    failure = _attempt(write, args, kwargs)
    if failure is not None:
        _log_failure(write, failure)
    return failure is None


def durable[**P](write: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> bool:
    """``safe``, for a run's outcome in a worker: while the database does not answer at all (a
    restart, a failover), wait for it with backoff and write again, instead of returning and
    letting the worker tell Redis of an outcome its record lacks (the run would be done in Redis
    and still queued in its record, and the stale-run repair would run it again). The run's
    lease is renewed meanwhile (the heartbeat needs only Redis) and the thread takes no other
    job. A write the database answers with an error (a bad value) is given up as by ``safe``."""
    outage: Outage | None = None
    while (failure := _attempt(write, args, kwargs)) is not None:
        if database_answers():
            _log_failure(write, failure)
            return False
        if outage is None:
            outage = Outage("kumiko_jobs", f"database {router.db_for_write(JobRun)!r}")
        outage.wait(f"{_name(write)} waits for it: {str(failure).strip()}")
    if outage is not None:
        outage.over()
    return True


def database_answers() -> bool:
    """Whether the run table's database answers a query now (its connection replaced if not)."""
    connection = connections[router.db_for_write(JobRun)]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError:
        db_connections.discard(connection)
        return False
    return True


def _attempt(write: Callable[..., object], args: Any, kwargs: Any) -> Exception | None:
    """Run the write; the failure, or None. A database error other than a bad value may be a
    connection that broke under us (on SQLite a closed one says ProgrammingError): the write
    gets one more try on a fresh connection."""
    failure = _try(write, args, kwargs)
    if isinstance(failure, DatabaseError) and not isinstance(failure, IntegrityError | DataError):
        connection = connections[router.db_for_write(JobRun)]
        if not connection.in_atomic_block:
            logger.debug("kumiko_jobs: run record write %s lost its connection; retrying", _name(write))
            db_connections.discard(connection)
            failure = _try(write, args, kwargs)
    return failure


def _try(write: Callable[..., object], args: Any, kwargs: Any) -> Exception | None:
    try:
        write(*args, **kwargs)
    except StaleAttempt:
        raise  # not a failed write: nothing was to be written (attempt_records.py)
    except Exception as exc:  # a bad value in a job's metadata must not stop the worker (poison job)
        return exc
    return None


def _log_failure(write: Callable[..., object], failure: Exception) -> None:
    logger.error("kumiko_jobs: run record write %s failed", _name(write), exc_info=failure)


def _name(write: Callable[..., object]) -> str:
    return getattr(write, "__name__", repr(write))
