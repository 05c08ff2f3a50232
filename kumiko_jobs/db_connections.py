"""A worker's database connections are the worker's business, whatever ``CONN_MAX_AGE`` says.

Django closes a connection at the end of each request when ``CONN_MAX_AGE`` is 0 (its
default), which for a worker would mean a new connection, and a new PostgreSQL backend, per
job. Between jobs a worker therefore keeps its connections and replaces one only when it is
unusable (checked with a ping only after an error, as Django does), when a job left it inside a
transaction (``atomic()`` never exited, autocommit switched off: the next job must not run in
it), or after ``WORKER_DB_MAX_AGE`` seconds (so a database failover or a connection pooler's
recycling is picked up eventually). Django's own ``close_old_connections`` is not used: it
applies ``CONN_MAX_AGE``. Connections are per thread, so each worker thread keeps its own.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.dispatch import receiver

from kumiko_jobs.conf import get_config

logger = logging.getLogger("kumiko_jobs")
_opened = 0
_opened_lock = threading.Lock()


@receiver(connection_created)
def _count_opened(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    global _opened
    with _opened_lock:
        _opened += 1
    # Our own age bound, independent of CONN_MAX_AGE (Django's close_at).
    connection.kumiko_opened_at = time.monotonic()  # type: ignore[attr-defined]


def opened_connections() -> int:
    """Database connections this process has opened (the worker's shutdown line reports it)."""
    return _opened


def open_transactions() -> dict[str, int]:
    """This thread's connections inside a transaction before a job, and how deep (the caller's:
    drain() in a test's transaction); ``tidy_after_job`` leaves those alone."""
    return {
        connection.alias: len(connection.atomic_blocks)
        for connection in connections.all(initialized_only=True)
        if connection.in_atomic_block
    }


def tidy_after_job(callers: dict[str, int] | None = None) -> None:
    """Keep this thread's connections for the next job unless one must be replaced.
    ``callers``: ``open_transactions()`` from before the job. A transaction the caller had open
    is not the job's to close: closing it rolled back the caller's own work (a test's data)."""
    max_age = float(get_config()["WORKER_DB_MAX_AGE"])
    now = time.monotonic()
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        depth = (callers or {}).get(connection.alias, 0)
        if depth:
            if len(connection.atomic_blocks) > depth:
                logger.warning(
                    "kumiko_jobs: a job left atomic() open inside its caller's transaction on %s; "
                    "it ends with the caller's",
                    connection.alias,
                )
            continue
        reason = _replace_reason(connection, now, max_age)
        if reason is None:
            # CONN_HEALTH_CHECKS applies between jobs too: Django checks a connection before the
            # first query after this flag is cleared (a worker's connection may sit idle for
            # hours while a pooler or a failover cuts it).
            connection.health_check_done = False  # type: ignore[attr-defined]  # not in the stubs
            continue
        logger.debug("kumiko_jobs: replacing database connection %s: %s", connection.alias, reason)
        discard(connection)


def discard(connection: BaseDatabaseWrapper) -> None:
    """Close a connection so the next query opens a fresh one, even if a job left it inside
    ``atomic()`` (Django keeps such a connection object until the block exits; this one never
    will). The server rolls back whatever the job left open."""
    try:
        connection.close()
    except DatabaseError:
        # Closing a broken connection can fail; it is forgotten either way.
        logger.debug("kumiko_jobs: closing %s failed", connection.alias, exc_info=True)
    finally:
        connection.in_atomic_block = False
        connection.connection = None


def _replace_reason(connection: BaseDatabaseWrapper, now: float, max_age: float) -> str | None:
    if connection.in_atomic_block or not connection.get_autocommit():
        # A job left a transaction open: rolling it back is the only safe thing, and closing
        # does that (and resets any session state it changed).
        return "a job left a transaction open"
    if connection.needs_rollback:
        return "a job left a broken transaction"
    if connection.errors_occurred:
        if not connection.is_usable():
            return "unusable after an error"
        connection.errors_occurred = False
    opened_at = getattr(connection, "kumiko_opened_at", now)
    if now - opened_at > max_age:
        return f"older than WORKER_DB_MAX_AGE ({max_age:g}s)"
    return None
