"""What Django's own ``tests/tasks`` cases need to run against KumikoTaskBackend.

Django's test files are not installed with Django (the wheel has no ``tests`` package), so the
``test_*.py`` files here reproduce its 6.1.3 cases one by one, same names, against this
backend's settings. Where a Django case expects a finished task (ImmediateBackend runs it inside
``enqueue()``), a worker drains the lanes in this process first (``kumiko_jobs.testing.drain``:
the code ``runjobs`` runs), and assertions are made on the result after ``refresh()``. Each
file's docstring lists the cases that do not apply, with the reason.

The cases are ``TransactionTestCase``s: runs are rows in the real database (committed, so the
drain and, in tests/integration, ``runjobs`` processes see them) and jobs in the real Redis
under the test's own prefix (tests/conftest.py). Each also checks, in its tearDown, that the
run rows it leaves keep the run table's rules (tests/run_invariants.py: ``CheckedRunRows``).
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

from kumiko_jobs.testing import drain

BACKEND = "kumiko_jobs.backends.KumikoTaskBackend"
# QUEUES as DESIGN.md configures them; "default" (a task without queue_name) is the worker lane.
KUMIKO_TASKS: dict[str, dict[str, Any]] = {"default": {"BACKEND": BACKEND, "QUEUES": ["worker", "api"]}}


def run_worker() -> dict[str, int]:
    """Run every queued task in this process, as a lane worker would."""
    return drain()


async def arun_worker() -> dict[str, int]:
    result: dict[str, int] = await sync_to_async(drain)()
    return result
