"""Checks of every job declaration, one function per option group."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from croniter import croniter
from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Tags, register

from kumiko_jobs.checks.schedules import JOB_GROUPS as SCHEDULE_GROUPS
from kumiko_jobs.checks.values import is_int_at_least, is_number_above, is_positive_int, is_zone
from kumiko_jobs.conf import get_config
from kumiko_jobs.definitions import (
    CONCURRENCY_MODES,
    CONCURRENCY_SCOPES,
    GRANTS,
    LANES,
    TENANT_ZONE,
    Backoff,
    CronTrigger,
    EscapeHatch,
    EventTrigger,
    JobDefinition,
    ManualTrigger,
    MaxPerTenant,
    TenantVisibleFailure,
    TenantVisibleRun,
)
from kumiko_jobs.registry import registry

Problem = tuple[str, str, str]  # message, hint, id suffix ("E001")


@register(Tags.compatibility, "kumiko_jobs")
def check_jobs(app_configs: Iterable[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for first, second in registry.duplicates:
        errors.append(
            Error(
                f"Duplicate job name {first.name!r}: declared by {_where(first)} and {_where(second)}.",
                hint="Give one of them another name with @job(name=...).",
                id="kumiko_jobs.E002",
            )
        )
    for definition in registry.all():
        errors.extend(check_definition(definition))
    return errors


def check_definition(d: JobDefinition) -> list[CheckMessage]:
    return [
        Error(f"Job {d.name!r}: {message}", hint=hint, obj=_where(d), id=f"kumiko_jobs.{code}")
        for group in _GROUPS
        for message, hint, code in group(d)
    ]


def _lane(d: JobDefinition) -> Iterator[Problem]:
    if d.lane not in LANES:
        yield (
            f"lane {d.lane!r} is not allowed.",
            'Use lane="api" (short, CPU-light jobs) or "worker".',
            "E001",
        )


def _triggers(d: JobDefinition) -> Iterator[Problem]:
    for trigger in d.triggers:
        if isinstance(trigger, CronTrigger):
            yield from _cron(trigger)
        elif isinstance(trigger, EventTrigger):
            if not trigger.events or not all(isinstance(e, str) and e for e in trigger.events):
                yield (
                    "on_event() needs one or more non-empty event names.",
                    'Example: on_event("invoice.created").',
                    "E016",
                )
            if trigger.where is not None and not isinstance(trigger.where, dict):
                yield (
                    "on_event(where=...) must be a dict of payload field -> value.",
                    'Example: on_event("invoice.created", where={"kind": "refund"}).',
                    "E024",
                )
        elif not isinstance(trigger, ManualTrigger):
            yield (
                f"{trigger!r} is not a trigger.",
                "Use cron(...), on_event(...), manual() or a list of them.",
                "E025",
            )


def _cron(trigger: CronTrigger) -> Iterator[Problem]:
    if not isinstance(trigger.expr, str) or len(trigger.expr.split()) not in (5, 6):
        yield (
            f"cron expression {trigger.expr!r} must have 5 fields (or 6 with leading seconds).",
            'Example: cron("0 7 * * *") runs daily at 07:00.',
            "E003",
        )
    elif not croniter.is_valid(trigger.expr, second_at_beginning=len(trigger.expr.split()) == 6):
        yield (
            f"cron expression {trigger.expr!r} is invalid.",
            "Check each field's range; https://crontab.guru explains the syntax.",
            "E003",
        )
    if trigger.tz != TENANT_ZONE and not is_zone(trigger.tz):
        yield (
            f"unknown time zone {trigger.tz!r}.",
            'Use an IANA name such as "Europe/Berlin" or "UTC", or "tenant" with per_tenant=True.',
            "E004",
        )


def _concurrency(d: JobDefinition) -> Iterator[Problem]:
    if d.concurrency not in CONCURRENCY_MODES:
        yield (
            f"concurrency {d.concurrency!r} is unknown.",
            f"Use one of {', '.join(CONCURRENCY_MODES)}.",
            "E015",
        )
    if d.concurrency_scope not in CONCURRENCY_SCOPES:
        yield f"concurrency_scope {d.concurrency_scope!r} is unknown.", 'Use "tenant" or "job".', "E022"
    if not is_positive_int(d.debounce_ms):
        yield (
            f"debounce_ms={d.debounce_ms!r} must be a positive integer.",
            "Example: debounce_ms=5000.",
            "E023",
        )
    mpt = d.max_per_tenant
    if (
        d.concurrency == "replace"
        and d.concurrency_scope == "job"
        and isinstance(mpt, MaxPerTenant)
        and mpt.on_limit == "defer"
    ):
        yield (
            'concurrency="replace" with concurrency_scope="job" cannot be combined with '
            'MaxPerTenant(on_limit="defer"): one waiting run per job spans tenants, the cap is per tenant.',
            'Use concurrency_scope="tenant" (one waiting run per job and tenant), or on_limit="skip".',
            "E026",
        )


def _max_per_tenant(d: JobDefinition) -> Iterator[Problem]:
    mpt = d.max_per_tenant
    if mpt is not None and (
        not isinstance(mpt, MaxPerTenant)
        or not is_positive_int(mpt.limit)
        or mpt.on_limit not in ("skip", "defer")
        or not is_positive_int(mpt.defer_ms)
    ):
        yield (
            f"max_per_tenant={mpt!r} is invalid.",
            'Use a positive int or MaxPerTenant(limit>=1, on_limit="skip"|"defer", defer_ms>=1).',
            "E008",
        )


def _attempts(d: JobDefinition) -> Iterator[Problem]:
    if not is_int_at_least(d.retries, 0):
        yield (
            f"retries={d.retries!r} must be an integer >= 0.",
            "retries counts extra attempts after the first.",
            "E014",
        )
    if d.backoff is not None and (
        not isinstance(d.backoff, Backoff)
        or d.backoff.kind not in ("fixed", "exponential")
        or not is_positive_int(d.backoff.delay_ms)
    ):
        yield (
            f"backoff={d.declared.get('backoff', d.backoff)!r} is invalid.",
            'Use "fixed", "exponential" or Backoff("fixed"|"exponential", delay_ms=1000).',
            "E009",
        )
    if d.timeout is not None and not is_number_above(d.timeout, 0):
        yield f"timeout={d.timeout!r} must be a positive number of seconds.", "Example: timeout=30.", "E010"
    if not is_int_at_least(d.max_defers, 0):
        yield (
            f"max_defers={d.max_defers!r} must be an integer >= 0.",
            "max_defers=N allows N deferrals.",
            "E011",
        )


def _boot(d: JobDefinition) -> Iterator[Problem]:
    if d.boot_gate and d.run_on_boot:
        yield (
            "boot_gate and run_on_boot cannot be combined (the job would run twice at start-up).",
            "Keep boot_gate=True to run it inline before the worker starts, or run_on_boot=True to queue it.",
            "E007",
        )


def _escape_hatch(d: JobDefinition) -> Iterator[Problem]:
    hatch = d.escape_hatch
    if hatch is None:
        return
    if not isinstance(hatch, EscapeHatch) or not isinstance(hatch.reason, str) or not hatch.reason.strip():
        yield (
            "escape_hatch needs a non-empty reason.",
            'Say why the job needs it: EscapeHatch("nightly cross-tenant billing export").',
            "E005",
        )
    elif not hatch.grants or any(g not in GRANTS for g in hatch.grants):
        yield (
            f"escape_hatch grants {hatch.grants!r} must be a non-empty subset of {GRANTS}.",
            f"Grant only what the job needs, e.g. grants=({GRANTS[0]!r},).",
            "E006",
        )


def _handler(d: JobDefinition) -> Iterator[Problem]:
    if not _importable_at_module_level(d):
        yield (
            "its handler is not importable at module level.",
            "Declare jobs as top-level functions of a module (not nested functions or lambdas).",
            "E012",
        )
    # A Django task's func is kumiko's own runner, which calls the task its own way.
    if d.task is None and not _takes_payload_and_ctx(d.func):
        yield (
            f"its handler {getattr(d.func, '__name__', d.func)!r}{_signature_text(d.func)} cannot be "
            "called as handler(payload, ctx); every attempt would fail with a TypeError.",
            "Give it two positional parameters: def handler(payload, ctx): ...",
            "E036",
        )


def _per_tenant(d: JobDefinition) -> Iterator[Problem]:
    if d.per_tenant and not get_config().get("ACTIVE_TENANTS"):
        yield (
            "per_tenant=True needs KUMIKO_JOBS['ACTIVE_TENANTS'].",
            "Set it to the dotted path of a function returning the active tenant ids.",
            "E017",
        )


def _tenant_visible(d: JobDefinition) -> Iterator[Problem]:
    run, failure = d.tenant_visible_run, d.tenant_visible_failure
    if run is not None and (not isinstance(run, TenantVisibleRun) or not _field_names(run.subject_fields)):
        yield (
            f"tenant_visible_run={run!r} is invalid.",
            'Use TenantVisibleRun(subject_fields=("invoice_id",)): a tuple of payload field names, or ().',
            "E302",
        )
    if failure is not None and (
        not isinstance(failure, TenantVisibleFailure)
        or not isinstance(failure.message_key, str)
        or not failure.message_key.strip()
        or len(failure.message_key) > 200
        or not _field_names(failure.subject_fields)
    ):
        yield (
            f"tenant_visible_failure={failure!r} is invalid.",
            'Use TenantVisibleFailure("billing.export_failed", subject_fields=("invoice_id",)): a '
            "message key of 1-200 characters for the tenant's UI and a tuple of payload field names.",
            "E303",
        )
    elif (
        isinstance(run, TenantVisibleRun)
        and isinstance(failure, TenantVisibleFailure)
        and run.subject_fields
        and failure.subject_fields
        and tuple(run.subject_fields) != tuple(failure.subject_fields)
    ):
        yield (
            f"tenant_visible_run and tenant_visible_failure name different subject_fields "
            f"({tuple(run.subject_fields)} and {tuple(failure.subject_fields)}); a run has one subject.",
            "Name the same subject_fields on both (or on one of them only: the other uses them too).",
            "E301",
        )


def _field_names(fields: object) -> bool:
    # A bare string would be read as one field per character.
    return isinstance(fields, tuple | list) and all(isinstance(f, str) and f for f in fields)


def _retry_window(d: JobDefinition) -> Iterator[Problem]:
    # A retried fan-out wrapper skips the tenants whose child rows exist: retention must not
    # delete those rows while the wrapper can still be retried.
    if not d.per_tenant or not is_int_at_least(d.retries, 0) or not isinstance(d.backoff, Backoff | None):
        return
    retention = get_config()["RUN_RETENTION"]
    if not is_number_above(retention, 0):
        return
    try:
        window = sum(d.retry_delay(attempt) for attempt in range(1, d.retries + 1))
    except (TypeError, OverflowError):
        return
    if window >= retention:
        yield (
            f"its retries span {window:.0f}s, at least KUMIKO_JOBS['RUN_RETENTION'] ({retention}s): "
            "a late retry of its fan-out would reach tenants again whose runs were pruned.",
            "Lower retries or the backoff delay, or raise RUN_RETENTION.",
            "E304",
        )


_GROUPS: tuple[Callable[[JobDefinition], Iterator[Problem]], ...] = (
    _lane,
    _triggers,
    _concurrency,
    _max_per_tenant,
    _attempts,
    _boot,
    _escape_hatch,
    _handler,
    _per_tenant,
    _tenant_visible,
    _retry_window,
    *SCHEDULE_GROUPS,
)


def _where(d: JobDefinition) -> str:
    if d.task is not None:
        return d.task.module_path
    return f"{getattr(d.func, '__module__', '?')}.{getattr(d.func, '__qualname__', '?')}"


def _takes_payload_and_ctx(func: Any) -> bool:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return True  # no signature to read (a C callable): its first run will tell
    try:
        signature.bind(None, None)
    except TypeError:
        return False
    return True


def _signature_text(func: Any) -> str:
    try:
        return str(inspect.signature(func))
    except (TypeError, ValueError):
        return ""


def _importable_at_module_level(d: JobDefinition) -> bool:
    module, qualname = getattr(d.func, "__module__", None), getattr(d.func, "__qualname__", "")
    if not module or "<" in qualname:
        return False
    try:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError):
        return False
    return target is d.func
