"""System checks (``kumiko_jobs.E0xx``): every job declaration and setting, each with a hint."""

from __future__ import annotations

import importlib
import re
import zoneinfo
from collections.abc import Iterable
from typing import Any

from croniter import croniter
from django.apps import AppConfig, apps
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning
from django.utils.module_loading import import_string

from kumiko_jobs.conf import CONFIG_DEFAULTS, get_config
from kumiko_jobs.definitions import (
    CONCURRENCY_MODES,
    CONCURRENCY_SCOPES,
    GRANTS,
    LANES,
    Backoff,
    CronTrigger,
    EscapeHatch,
    EventTrigger,
    JobDefinition,
    ManualTrigger,
    MaxPerTenant,
)
from kumiko_jobs.registry import registry

_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


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
    out: list[CheckMessage] = []

    def err(msg: str, hint: str, code: str) -> None:
        out.append(Error(f"Job {d.name!r}: {msg}", hint=hint, obj=_where(d), id=f"kumiko_jobs.{code}"))

    if d.lane not in LANES:
        err(f"lane {d.lane!r} is not allowed.", 'Use lane="api" (short, CPU-light jobs) or "worker".', "E001")
    for trigger in d.triggers:
        if isinstance(trigger, CronTrigger):
            if not isinstance(trigger.expr, str) or len(trigger.expr.split()) not in (5, 6):
                err(
                    f"cron expression {trigger.expr!r} must have 5 fields (or 6 with leading seconds).",
                    'Example: cron("0 7 * * *") runs daily at 07:00.',
                    "E003",
                )
            elif not croniter.is_valid(trigger.expr, second_at_beginning=len(trigger.expr.split()) == 6):
                err(
                    f"cron expression {trigger.expr!r} is invalid.",
                    "Check each field's range; https://crontab.guru explains the syntax.",
                    "E003",
                )
            if not _valid_zone(trigger.tz):
                err(
                    f"unknown time zone {trigger.tz!r}.",
                    'Use an IANA name such as "Europe/Berlin" or "UTC".',
                    "E004",
                )
        elif isinstance(trigger, EventTrigger):
            if not trigger.events or not all(isinstance(e, str) and e for e in trigger.events):
                err(
                    "on_event() needs one or more non-empty event names.",
                    'Example: on_event("invoice.created").',
                    "E016",
                )
            if trigger.where is not None and not isinstance(trigger.where, dict):
                err(
                    "on_event(where=...) must be a dict of payload field -> value.",
                    'Example: on_event("invoice.created", where={"kind": "refund"}).',
                    "E016",
                )
        elif not isinstance(trigger, ManualTrigger):
            err(
                f"{trigger!r} is not a trigger.",
                "Use cron(...), on_event(...), manual() or a list of them.",
                "E016",
            )
    if d.concurrency not in CONCURRENCY_MODES:
        err(
            f"concurrency {d.concurrency!r} is unknown.",
            f"Use one of {', '.join(CONCURRENCY_MODES)}.",
            "E015",
        )
    if d.concurrency_scope not in CONCURRENCY_SCOPES:
        err(f"concurrency_scope {d.concurrency_scope!r} is unknown.", 'Use "tenant" or "job".', "E015")
    if not _positive_int(d.debounce_ms):
        err(
            f"debounce_ms={d.debounce_ms!r} must be a positive integer.", "Example: debounce_ms=5000.", "E015"
        )
    mpt = d.max_per_tenant
    if mpt is not None and (
        not isinstance(mpt, MaxPerTenant)
        or not _positive_int(mpt.limit)
        or mpt.on_limit not in ("skip", "defer")
        or not _positive_int(mpt.defer_ms)
    ):
        err(
            f"max_per_tenant={mpt!r} is invalid.",
            'Use a positive int or MaxPerTenant(limit>=1, on_limit="skip"|"defer", defer_ms>=1).',
            "E008",
        )
    if not (isinstance(d.retries, int) and not isinstance(d.retries, bool) and d.retries >= 0):
        err(
            f"retries={d.retries!r} must be an integer >= 0.",
            "retries counts extra attempts after the first.",
            "E014",
        )
    if d.backoff is not None and (
        not isinstance(d.backoff, Backoff)
        or d.backoff.kind not in ("fixed", "exponential")
        or not _positive_int(d.backoff.delay_ms)
    ):
        err(
            f"backoff={d.declared.get('backoff', d.backoff)!r} is invalid.",
            'Use "fixed", "exponential" or Backoff("fixed"|"exponential", delay_ms=1000).',
            "E009",
        )
    if d.timeout is not None and (
        isinstance(d.timeout, bool) or not isinstance(d.timeout, int | float) or d.timeout <= 0
    ):
        err(f"timeout={d.timeout!r} must be a positive number of seconds.", "Example: timeout=30.", "E010")
    if not (isinstance(d.max_defers, int) and not isinstance(d.max_defers, bool) and d.max_defers >= 0):
        err(
            f"max_defers={d.max_defers!r} must be an integer >= 0.",
            "max_defers=N allows N deferrals.",
            "E011",
        )
    if d.boot_gate and d.run_on_boot:
        err(
            "boot_gate and run_on_boot cannot be combined (the job would run twice at start-up).",
            "Keep boot_gate=True to run it inline before the worker starts, or run_on_boot=True to queue it.",
            "E007",
        )
    hatch = d.escape_hatch
    if hatch is not None:
        if (
            not isinstance(hatch, EscapeHatch)
            or not isinstance(hatch.reason, str)
            or not hatch.reason.strip()
        ):
            err(
                "escape_hatch needs a non-empty reason.",
                'Say why the job needs it: EscapeHatch("nightly cross-tenant billing export").',
                "E005",
            )
        elif not hatch.grants or any(g not in GRANTS for g in hatch.grants):
            err(
                f"escape_hatch grants {hatch.grants!r} must be a non-empty subset of {GRANTS}.",
                f"Grant only what the job needs, e.g. grants=({GRANTS[0]!r},).",
                "E006",
            )
    if not _importable_at_module_level(d):
        err(
            "its handler is not importable at module level.",
            "Declare jobs as top-level functions of a module (not nested functions or lambdas).",
            "E012",
        )
    if d.per_tenant and not get_config().get("ACTIVE_TENANTS"):
        err(
            "per_tenant=True needs KUMIKO_JOBS['ACTIVE_TENANTS'].",
            "Set it to the dotted path of a function returning the active tenant ids.",
            "E017",
        )
    return out


@register(Tags.compatibility, "kumiko_jobs")
def check_settings(app_configs: Iterable[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    config = get_config()
    out: list[CheckMessage] = []
    unknown = set(config) - set(CONFIG_DEFAULTS)
    for key in sorted(unknown):
        out.append(
            CheckWarning(
                f"KUMIKO_JOBS[{key!r}] is not a known setting and is ignored.",
                hint=f"Known settings: {', '.join(sorted(CONFIG_DEFAULTS))}.",
                id="kumiko_jobs.W001",
            )
        )
    # REDIS / REDIS_URL: redis_checks.py (kumiko_jobs.E101-E104, W105).
    prefix = config["QUEUE_PREFIX"]
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        out.append(
            Error(
                f"KUMIKO_JOBS['QUEUE_PREFIX'] {prefix!r} is invalid.",
                hint="Use 1-64 characters of letters, digits and _ . : -",
                id="kumiko_jobs.E013",
            )
        )
    for key in ("ACTIVE_TENANTS", "USER_TENANT", "TENANT_ACTIVATOR"):
        value = config.get(key)
        if value is None:
            continue
        try:
            target = import_string(value) if isinstance(value, str) else value
        except ImportError as exc:
            target, problem = None, str(exc)
        else:
            problem = "" if callable(target) else "it is not callable"
        if target is None or problem:
            out.append(
                Error(
                    f"KUMIKO_JOBS[{key!r}] = {value!r} cannot be used: {problem}.",
                    hint="Give the dotted path of a callable, e.g. 'myapp.tenants.active_tenant_ids'.",
                    id="kumiko_jobs.E013",
                )
            )
    model = config.get("TENANT_MODEL")
    if model is not None:
        try:
            apps.get_model(model)
        except (LookupError, ValueError) as exc:
            out.append(
                Error(
                    f"KUMIKO_JOBS['TENANT_MODEL'] = {model!r} is not an installed model ({exc}).",
                    hint="Use 'app_label.ModelName' of your tenant model, or remove the setting.",
                    id="kumiko_jobs.E013",
                )
            )
    for key in (
        "REDIS_TIMEOUT",
        "RESULT_TTL",
        "FAILURE_TTL",
        "ABANDON_AFTER",
        "HEARTBEAT_INTERVAL",
        "UNKNOWN_JOB_GRACE",
        "UNKNOWN_JOB_RETRY_DELAY",
        "TENANT_CACHE_SECONDS",
    ):
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            out.append(
                Error(
                    f"KUMIKO_JOBS[{key!r}] = {value!r} must be a positive number.",
                    hint=f"The default is {CONFIG_DEFAULTS[key]!r}.",
                    id="kumiko_jobs.E013",
                )
            )
    delay = config["RUNNING_MARK_DELAY"]
    if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
        out.append(
            Error(
                f"KUMIKO_JOBS['RUNNING_MARK_DELAY'] = {delay!r} must be a number of seconds >= 0.",
                hint="0 marks every run running at once; the default 0.2 skips that write for short runs.",
                id="kumiko_jobs.E013",
            )
        )
    if config["HEARTBEAT_INTERVAL"] * 2 > config["ABANDON_AFTER"]:
        out.append(
            Error(
                "KUMIKO_JOBS['ABANDON_AFTER'] must be at least twice HEARTBEAT_INTERVAL.",
                hint="Otherwise a live but briefly slow worker is declared dead.",
                id="kumiko_jobs.E013",
            )
        )
    return out


def _where(d: JobDefinition) -> str:
    return f"{getattr(d.func, '__module__', '?')}.{getattr(d.func, '__qualname__', '?')}"


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _valid_zone(tz: Any) -> bool:
    if not isinstance(tz, str) or not tz:
        return False
    try:
        zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True


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
