"""kumiko_jobs: multi-tenant background jobs for Django on Redis and RQ."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kumiko_jobs.definitions import (
    Backoff,
    EscapeHatch,
    MaxPerTenant,
    TenantVisibleFailure,
    TenantVisibleRun,
    cron,
    manual,
    on_event,
)
from kumiko_jobs.exceptions import (
    DeferralError,
    EscapeHatchDenied,
    InvalidDispatch,
    InvalidPayload,
    InvalidTenant,
    JobTimeout,
    KumikoJobsError,
    QueueUnavailable,
    UnknownEvent,
    UnknownJob,
    UnrecoverableError,
)
from kumiko_jobs.registry import job

if TYPE_CHECKING:
    from kumiko_jobs.dispatching import DispatchResult, dispatch, emit
    from kumiko_jobs.tenant_history import tenant_failures, tenant_runs

__all__ = [
    "Backoff",
    "DeferralError",
    "DispatchResult",
    "EscapeHatch",
    "EscapeHatchDenied",
    "InvalidDispatch",
    "InvalidPayload",
    "InvalidTenant",
    "JobTimeout",
    "KumikoJobsError",
    "MaxPerTenant",
    "QueueUnavailable",
    "TenantVisibleFailure",
    "TenantVisibleRun",
    "UnknownEvent",
    "UnknownJob",
    "UnrecoverableError",
    "cron",
    "dispatch",
    "emit",
    "job",
    "manual",
    "on_event",
    "tenant_failures",
    "tenant_runs",
]


def __getattr__(name: str) -> Any:
    # dispatch imports the models; keep ``import kumiko_jobs`` safe before apps are ready.
    if name in ("dispatch", "emit", "DispatchResult"):
        from kumiko_jobs import dispatching as module

        return getattr(module, name)
    if name in ("tenant_runs", "tenant_failures"):
        from kumiko_jobs import tenant_history

        return getattr(tenant_history, name)
    raise AttributeError(f"module 'kumiko_jobs' has no attribute {name!r}")
