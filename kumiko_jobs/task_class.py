"""``KumikoTask``: the ``Task`` class of ``KumikoTaskBackend``, carrying kumiko's options.

Django 6.1 hands the extra keywords of ``@task(...)`` to the backend's ``task_class``, so a task
declares kumiko options where it is declared::

    @task(retries=3, backoff="exponential", timeout=30, max_per_tenant=2)
    def sync_invoices(account_id): ...

They mean what the same ``@job`` options mean (``max_per_tenant=N`` is a cap: runs over it wait,
``MaxPerTenant(N, on_limit="defer")``; a skipped enqueue could return no result, so "skip" is
refused by the checks). Bad values are reported by ``manage.py check`` like a job's. django-stubs
6.1.2 types ``task()`` without these keywords: type checkers want ``# type: ignore[call-overload]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.tasks import Task

from kumiko_jobs.definitions import Backoff, MaxPerTenant

if TYPE_CHECKING:
    _TaskBase = Task[..., Any]
else:  # Task is generic only in django-stubs; never subscript it at runtime
    _TaskBase = Task


@dataclass(frozen=True, slots=True, kw_only=True)
class KumikoTask(_TaskBase):
    """A Django task with kumiko's per-job options (all optional)."""

    retries: int = 0
    backoff: Backoff | str | None = None
    timeout: float | None = None
    max_per_tenant: MaxPerTenant | int | None = None
