"""What a job is: its definition, triggers and option types (frozen dataclasses, pure data).

``@job`` (in ``registry.py``) builds these; ``checks.py`` validates them, so a project sees every
problem at once as Django system-check errors with hints instead of the first ImportError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from django.tasks import Task

    from kumiko_jobs.context import JobContext

Handler = Callable[[dict[str, Any], "JobContext"], Any]

LANES = ("api", "worker")
CONCURRENCY_MODES = ("parallel", "sequential", "skip", "replace", "debounce")
CONCURRENCY_SCOPES = ("tenant", "job")
GRANTS = ("unscoped", "global_writes", "system_identity")
DEFAULT_BACKOFF_MS = 1000
# cron(..., tz=TENANT_ZONE): each tenant's run fires at that tenant's local time.
TENANT_ZONE = "tenant"
# A per-tenant job dispatched without a tenant runs as a wrapper of this name, which fans out
# one child run per active tenant (fanout.py).
PER_TENANT_PREFIX = "_per_tenant:"


def wrapper_name(job_name: str) -> str:
    """The run name of a per-tenant job's fan-out wrapper."""
    return PER_TENANT_PREFIX + job_name


def wrapped_job(run_name: str) -> str | None:
    """The job a fan-out wrapper run fans out, or None if ``run_name`` is not a wrapper."""
    return run_name[len(PER_TENANT_PREFIX) :] if run_name.startswith(PER_TENANT_PREFIX) else None


@dataclass(frozen=True)
class CronTrigger:
    """``cron(expr, tz)``: fire on a schedule (5 fields, or 6 with leading seconds) in ``tz``."""

    expr: str
    tz: str = "UTC"


@dataclass(frozen=True)
class EventTrigger:
    """``on_event(names, where)``: fire when ``emit()`` names one of ``events`` and ``where`` matches."""

    events: tuple[str, ...]
    where: Mapping[str, Any] | None = None

    def matches(self, event: str, payload: Mapping[str, Any]) -> bool:
        if event not in self.events:
            return False
        if not self.where:
            return True
        return all(key in payload and payload[key] == value for key, value in self.where.items())


@dataclass(frozen=True)
class ManualTrigger:
    """``manual()``: run only when dispatched."""


Trigger = CronTrigger | EventTrigger | ManualTrigger


def cron(expr: str, tz: str = "UTC") -> CronTrigger:
    """Run on a cron schedule (5 fields, or 6 with leading seconds) in time zone ``tz``: an IANA
    name, or ``"tenant"`` (with ``per_tenant=True``) for each tenant's own zone."""
    return CronTrigger(expr=expr, tz=tz)


def on_event(name_or_names: str | Sequence[str], where: Mapping[str, Any] | None = None) -> EventTrigger:
    """Run when ``emit()`` fires one of these events and every ``where`` field equals the payload's."""
    names = (name_or_names,) if isinstance(name_or_names, str) else tuple(name_or_names)
    return EventTrigger(events=names, where=dict(where) if where is not None else None)


def manual() -> ManualTrigger:
    """Run only when dispatched."""
    return ManualTrigger()


@dataclass(frozen=True)
class MaxPerTenant:
    """At most ``limit`` runs of the job per tenant at once.

    ``on_limit="skip"``: a dispatch over the limit (queued + running) returns ``skipped``.
    ``on_limit="defer"``: every dispatch is queued, but runs over the limit wait in the queue
    until a slot frees (``defer_ms`` is the base delay of the rare fallback for runs queued
    under an older, higher cap).
    """

    limit: int
    on_limit: Literal["skip", "defer"] = "skip"
    defer_ms: int = 1000


@dataclass(frozen=True)
class Backoff:
    """Delay between attempts: ``fixed`` (always ``delay_ms``) or ``exponential`` (1x, 2x, 4x...)."""

    kind: Literal["fixed", "exponential"] = "exponential"
    delay_ms: int = DEFAULT_BACKOFF_MS

    def delay_for(self, failed_attempt: int) -> float:
        """Seconds to wait after ``failed_attempt`` (1-based) failed: base, 2·base, 4·base…"""
        factor = 1 if self.kind == "fixed" else 2 ** (failed_attempt - 1)
        return self.delay_ms * factor / 1000.0


@dataclass(frozen=True)
class TenantVisibleRun:
    """The tenant may see these runs (status, subject, times), never payloads or errors."""

    subject_fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class TenantVisibleFailure:
    """A final failure leaves the tenant a record with ``message_key`` per (job, subject)."""

    message_key: str
    subject_fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class EscapeHatch:
    """Declares why a job may leave its tenant's scope and which ``grants`` it needs; every use
    is audited (``EscapeHatchAudit``)."""

    reason: str
    grants: tuple[str, ...] = GRANTS


@dataclass(frozen=True)
class JobDefinition:
    """Everything declared about one job. Built by ``@job``; validated by the system checks."""

    name: str
    func: Handler
    triggers: tuple[Trigger, ...] = (ManualTrigger(),)
    lane: str = "worker"
    per_tenant: bool = False
    concurrency: str = "parallel"
    concurrency_scope: str = "tenant"
    debounce_ms: int = 5000
    max_per_tenant: MaxPerTenant | None = None
    retries: int = 0
    backoff: Backoff | None = None
    timeout: float | None = None
    run_on_boot: bool = False
    boot_gate: bool = False
    tenant_visible_run: TenantVisibleRun | None = None
    tenant_visible_failure: TenantVisibleFailure | None = None
    escape_hatch: EscapeHatch | None = None
    max_defers: int = 20
    system_scope: bool = False
    # Seconds over which a per-tenant fan-out's children are spread (0 = all at once).
    spread: float = 0
    # A Django ``@task`` run as this job (task_jobs.py builds the definition; not an @job option):
    # its runs wait in priority-ordered flows and ``func`` is the task runner.
    task: Task[..., Any] | None = field(default=None, compare=False, repr=False)
    # Raw declared values the checks report on when normalisation was impossible.
    declared: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def max_attempts(self) -> int:
        """Attempts a run gets: the first one plus ``retries``."""
        return self.retries + 1

    def retry_delay(self, failed_attempt: int) -> float:
        """Seconds before the next attempt; 0 without a backoff (retry at once)."""
        return self.backoff.delay_for(failed_attempt) if self.backoff else 0.0

    def grants(self, grant: str) -> bool:
        """Whether the declaration unlocks escape hatch ``grant``."""
        if self.system_scope:
            return True
        return self.escape_hatch is not None and grant in self.escape_hatch.grants
