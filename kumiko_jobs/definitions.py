"""Job definitions: the ``@job`` decorator, triggers and option types (all frozen dataclasses).

The decorator records what was declared, normalising only unambiguous shorthands; it does not
reject bad values. Validation happens in ``checks.py`` so a project sees every problem at once,
as Django system-check errors with hints, instead of the first ImportError.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, overload

if TYPE_CHECKING:
    from kumiko_jobs.context import JobContext

Handler = Callable[[dict[str, Any], "JobContext"], Any]

LANES = ("api", "worker")
CONCURRENCY_MODES = ("parallel", "sequential", "skip", "replace", "debounce")
CONCURRENCY_SCOPES = ("tenant", "job")
GRANTS = ("unscoped", "global_writes", "system_identity")
DEFAULT_BACKOFF_MS = 1000
# cron(..., tz=TENANT_ZONE): each tenant's run fires at that tenant's local time.
TENANT_ZONE = "tenant"


@dataclass(frozen=True)
class CronTrigger:
    expr: str
    tz: str = "UTC"


@dataclass(frozen=True)
class EventTrigger:
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
    pass


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
    limit: int
    on_limit: Literal["skip", "defer"] = "skip"
    defer_ms: int = 1000


@dataclass(frozen=True)
class Backoff:
    kind: Literal["fixed", "exponential"] = "exponential"
    delay_ms: int = DEFAULT_BACKOFF_MS

    def delay_for(self, failed_attempt: int) -> float:
        """Seconds to wait after ``failed_attempt`` (1-based) failed: base, 2·base, 4·base…"""
        factor = 1 if self.kind == "fixed" else 2 ** (failed_attempt - 1)
        return self.delay_ms * factor / 1000.0


@dataclass(frozen=True)
class TenantVisibleRun:
    subject_fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class TenantVisibleFailure:
    message_key: str
    subject_fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class EscapeHatch:
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
    # Raw declared values the checks report on when normalisation was impossible.
    declared: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def max_attempts(self) -> int:
        return self.retries + 1

    def retry_delay(self, failed_attempt: int) -> float:
        """Seconds before the next attempt; 0 without a backoff (retry at once)."""
        return self.backoff.delay_for(failed_attempt) if self.backoff else 0.0

    def grants(self, grant: str) -> bool:
        if self.system_scope:
            return True
        return self.escape_hatch is not None and grant in self.escape_hatch.grants


def _normalise_backoff(value: Any) -> Any:
    if isinstance(value, str) and value in ("fixed", "exponential"):
        return Backoff(value)  # type: ignore[arg-type]
    return value


def _normalise_max_per_tenant(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return MaxPerTenant(limit=value)
    return value


def _normalise_triggers(value: Any) -> tuple[Any, ...]:
    if isinstance(value, list | tuple):
        return tuple(value)
    return (value,)


@overload
def job(name: Handler, /) -> Handler: ...
@overload
def job(name: str | None = None, /, **options: Any) -> Callable[[Handler], Handler]: ...


def job(name: str | Handler | None = None, /, **options: Any) -> Any:
    """Declare a job: ``@job`` or ``@job("billing.export", trigger=cron("0 7 * * *"), retries=3)``.

    Options are those of ``JobDefinition``; ``trigger`` takes one trigger or a list. The name
    defaults to ``"<app_label>.<function name>"``. Registration happens at import time; the
    system checks (``manage.py check``) report invalid options.
    """
    if callable(name):
        return job()(name)
    job_name: str | None = options.pop("name", name)

    def decorate(func: Handler) -> Handler:
        from kumiko_jobs.registry import registry

        registry.register(build_definition(func, job_name, options))
        return func

    return decorate


def build_definition(func: Handler, name: str | None, options: Mapping[str, Any]) -> JobDefinition:
    opts = dict(options)
    declared = dict(opts)
    triggers = _normalise_triggers(opts.pop("trigger", ManualTrigger()))
    known = {
        f for f in JobDefinition.__dataclass_fields__ if f not in ("name", "func", "triggers", "declared")
    }
    unknown = set(opts) - known
    if unknown:
        # A typo in an option would otherwise silently disable it.
        raise TypeError(f"@job got unknown option(s) {sorted(unknown)}; valid options: {sorted(known)}")
    if "backoff" in opts:
        opts["backoff"] = _normalise_backoff(opts["backoff"])
    if "max_per_tenant" in opts:
        opts["max_per_tenant"] = _normalise_max_per_tenant(opts["max_per_tenant"])
    if isinstance(opts.get("escape_hatch"), EscapeHatch):
        opts["escape_hatch"] = EscapeHatch(opts["escape_hatch"].reason, tuple(opts["escape_hatch"].grants))
    return JobDefinition(
        name=name or default_job_name(func), func=func, triggers=triggers, declared=declared, **opts
    )


def default_job_name(func: Handler) -> str:
    from django.apps import apps

    module = getattr(func, "__module__", "") or ""
    app = apps.get_containing_app_config(module) if apps.apps_ready else None
    label = app.label if app is not None else module.rsplit(".", 1)[0]
    return f"{label}.{getattr(func, '__name__', 'job')}"
