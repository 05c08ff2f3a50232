"""Whether ``runjobs`` can start on its database: reachable, and kumiko_jobs' migrations applied.

Both are start-up mistakes that a worker cannot ride out. Without the check, a worker on an
unmigrated database ran on with an error and a traceback at every upkeep interval and failed
every run's write; on an unreachable one it printed a traceback and, with ``--burst``, exited 0.
Said once, before any boot gate or job, as Redis being unreachable is.

The connection the check opens is the one the worker goes on to use (the main thread's), so a
one-thread worker still opens a single connection.
"""

from __future__ import annotations

from django.db import DatabaseError, connections, router

from kumiko_jobs.models import JobRun

SHOWN = 5  # migrations named in the message; a new database lacks them all


def description(alias: str) -> str:
    """A database as the worker's banner and this module's messages name it: vendor:NAME."""
    connection = connections[alias]
    return f"{connection.vendor}:{connection.settings_dict.get('NAME')}"


def database_problem() -> str | None:
    """What keeps a worker from starting on the run table's database, with the cure, or None."""
    alias = router.db_for_write(JobRun)
    connection = connections[alias]
    where = description(alias)
    app = JobRun._meta.app_label
    try:
        from django.db.migrations.executor import MigrationExecutor

        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes(app))
    except DatabaseError as exc:
        text = str(exc).strip()
        reason = text.splitlines()[0] if text else type(exc).__name__  # the driver's first line
        return (
            f"database {alias!r} ({where}) is not reachable ({reason}). "
            f"Check that it runs and that DATABASES[{alias!r}] points at it."
        )
    if plan:
        # The plan to kumiko_jobs' latest migration: its own, and those of apps it depends on.
        names = [f"{migration.app_label}.{migration.name}" for migration, _backwards in plan]
        shown = ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")
        return (
            f"database {alias!r} ({where}) lacks {len(names)} migration(s) {app} needs "
            f"({shown}). Run `manage.py migrate` before starting workers."
        )
    return None
