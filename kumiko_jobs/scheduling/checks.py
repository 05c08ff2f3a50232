"""System checks of schedules, boot and events (``kumiko_jobs.E2xx``), one id per rule."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Tags, register
from django.utils.module_loading import import_string

from kumiko_jobs.conf import CONFIG_DEFAULTS, get_config
from kumiko_jobs.definitions import TENANT_ZONE, CronTrigger, EventTrigger, JobDefinition
from kumiko_jobs.events import close_matches
from kumiko_jobs.registry import registry

POSITIVE_SECONDS = ("CRON_CATCH_UP", "ORPHAN_GRACE", "TENANT_ZONE_REFRESH", "BOOT_GATE_WARN_AFTER")


@register(Tags.compatibility, "kumiko_jobs")
def check_schedule_declarations(
    app_configs: Iterable[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    events = _declared_events()
    return [m for d in registry.all() for m in check_definition(d, events)]


def check_definition(d: JobDefinition, events: frozenset[str] | None = None) -> list[CheckMessage]:
    out: list[CheckMessage] = []
    where = f"{getattr(d.func, '__module__', '?')}.{getattr(d.func, '__qualname__', '?')}"

    def err(msg: str, hint: str, code: str) -> None:
        out.append(Error(f"Job {d.name!r}: {msg}", hint=hint, obj=where, id=f"kumiko_jobs.{code}"))

    spread = d.spread
    if isinstance(spread, bool) or not isinstance(spread, int | float) or spread < 0:
        err(
            f"spread={spread!r} must be a number of seconds >= 0.",
            "spread=600 spreads a per-tenant tick's children over ten minutes; 0 starts them at once.",
            "E201",
        )
    elif spread and not d.per_tenant:
        err(
            f"spread={spread!r} needs per_tenant=True (it spreads the tenants' runs of one tick).",
            "Remove spread, or declare the job per_tenant=True.",
            "E202",
        )
    if not d.per_tenant and any(isinstance(t, CronTrigger) and t.tz == TENANT_ZONE for t in d.triggers):
        err(
            'cron(..., tz="tenant") needs per_tenant=True: only a tenant\'s own run has a local time.',
            'Declare per_tenant=True, or give an IANA zone such as tz="Europe/Berlin".',
            "E203",
        )
    if d.boot_gate and d.per_tenant:
        err(
            "boot_gate=True cannot be combined with per_tenant=True: a gate runs once, inline, "
            "without a tenant.",
            "Make the gate a tenant-less job that checks every tenant itself, or drop boot_gate.",
            "E204",
        )
    if events is not None:
        for trigger in d.triggers:
            if not isinstance(trigger, EventTrigger):
                continue
            for event in trigger.events:
                if isinstance(event, str) and event and event not in events:
                    matches = close_matches(event, events)
                    err(
                        f"on_event({event!r}) names an event missing from KUMIKO_JOBS['EVENTS'].",
                        (f"Did you mean: {', '.join(matches)}? " if matches else "")
                        + "Fix the name, or add it to KUMIKO_JOBS['EVENTS'].",
                        "E208",
                    )
    return out


@register(Tags.compatibility, "kumiko_jobs")
def check_schedule_settings(
    app_configs: Iterable[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    config = get_config()
    out: list[CheckMessage] = []
    path = config.get("TENANT_TIMEZONE")
    if path is not None:
        try:
            target = import_string(path) if isinstance(path, str) else path
        except ImportError as exc:
            target, problem = None, str(exc)
        else:
            problem = "" if callable(target) else "it is not callable"
        if target is None or problem:
            out.append(
                Error(
                    f"KUMIKO_JOBS['TENANT_TIMEZONE'] = {path!r} cannot be used: {problem}.",
                    hint="Give the dotted path of a function (tenant_id) -> IANA zone name, "
                    "e.g. 'myapp.tenants.tenant_timezone'.",
                    id="kumiko_jobs.E205",
                )
            )
    for key in POSITIVE_SECONDS:
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            out.append(
                Error(
                    f"KUMIKO_JOBS[{key!r}] = {value!r} must be a positive number of seconds.",
                    hint=f"The default is {CONFIG_DEFAULTS[key]!r}.",
                    id="kumiko_jobs.E206",
                )
            )
    release = config["RELEASE"]
    if not isinstance(release, str) or len(release) > 100:
        out.append(
            Error(
                f"KUMIKO_JOBS['RELEASE'] = {release!r} must be a string of at most 100 characters.",
                hint="Use your deploy's version or commit, e.g. os.environ.get('GIT_SHA', '').",
                id="kumiko_jobs.E207",
            )
        )
    events = config.get("EVENTS")
    if events is not None and (
        isinstance(events, str)
        or not isinstance(events, list | tuple | set | frozenset)
        or not all(isinstance(e, str) and e for e in events)
    ):
        out.append(
            Error(
                f"KUMIKO_JOBS['EVENTS'] = {events!r} must be a list of non-empty event names.",
                hint='Example: "EVENTS": ["invoice.created", "invoice.paid"], or None to allow any name.',
                id="kumiko_jobs.E209",
            )
        )
    return out


def _declared_events() -> frozenset[str] | None:
    events = get_config().get("EVENTS")
    if events is None or isinstance(events, str) or not isinstance(events, list | tuple | set | frozenset):
        return None  # E209 reports a malformed list
    return frozenset(e for e in events if isinstance(e, str))
