"""Checks of schedules, boot options and event names (``kumiko_jobs.E2xx``), one id per rule.

The job groups join ``checks/jobs.py``'s, the setting rules ``checks/settings.py``'s; the
numeric schedule settings are in its POSITIVE_NUMBERS and TENANT_TIMEZONE in its HOOKS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from kumiko_jobs.checks.values import is_number_above
from kumiko_jobs.definitions import TENANT_ZONE, CronTrigger, EventTrigger, JobDefinition
from kumiko_jobs.events import close_matches, declared_events, is_name_list

Problem = tuple[str, str, str]  # message, hint, id suffix


def _spread(d: JobDefinition) -> Iterator[Problem]:
    if not is_number_above(d.spread, 0, inclusive=True):
        yield (
            f"spread={d.spread!r} must be a number of seconds >= 0.",
            "spread=600 spreads a per-tenant tick's children over ten minutes; 0 starts them at once.",
            "E201",
        )
    elif d.spread and not d.per_tenant:
        yield (
            f"spread={d.spread!r} needs per_tenant=True (it spreads the tenants' runs of one tick).",
            "Remove spread, or declare the job per_tenant=True.",
            "E202",
        )


def _tenant_zone(d: JobDefinition) -> Iterator[Problem]:
    if not d.per_tenant and any(isinstance(t, CronTrigger) and t.tz == TENANT_ZONE for t in d.triggers):
        yield (
            'cron(..., tz="tenant") needs per_tenant=True: only a tenant\'s own run has a local time.',
            'Declare per_tenant=True, or give an IANA zone such as tz="Europe/Berlin".',
            "E203",
        )


def _boot_gate_tenant(d: JobDefinition) -> Iterator[Problem]:
    if d.boot_gate and d.per_tenant:
        yield (
            "boot_gate=True cannot be combined with per_tenant=True: a gate runs once, inline, without "
            "a tenant.",
            "Make the gate a tenant-less job that checks every tenant itself, or drop boot_gate.",
            "E204",
        )


def _declared_events(d: JobDefinition) -> Iterator[Problem]:
    events = declared_events()
    if events is None:
        return
    for trigger in d.triggers:
        if not isinstance(trigger, EventTrigger):
            continue
        for event in trigger.events:
            if isinstance(event, str) and event and event not in events:
                matches = close_matches(event, events)
                yield (
                    f"on_event({event!r}) names an event missing from KUMIKO_JOBS['EVENTS'].",
                    (f"Did you mean: {', '.join(matches)}? " if matches else "")
                    + "Fix the name, or add it to KUMIKO_JOBS['EVENTS'].",
                    "E207",
                )


JOB_GROUPS: tuple[Callable[[JobDefinition], Iterator[Problem]], ...] = (
    _spread,
    _tenant_zone,
    _boot_gate_tenant,
    _declared_events,
)


def _release(config: dict[str, Any]) -> Iterator[Problem]:
    release = config["RELEASE"]
    if not isinstance(release, str) or len(release) > 100:
        yield (
            f"KUMIKO_JOBS['RELEASE'] = {release!r} must be a string of at most 100 characters.",
            "Use your deploy's version or commit, e.g. os.environ.get('GIT_SHA', '').",
            "E205",
        )


def _events(config: dict[str, Any]) -> Iterator[Problem]:
    events = config.get("EVENTS")
    if events is not None and not is_name_list(events):
        yield (
            f"KUMIKO_JOBS['EVENTS'] = {events!r} must be a list of non-empty event names.",
            'Example: "EVENTS": ["invoice.created", "invoice.paid"], or None to allow any name.',
            "E206",
        )


SETTING_RULES: tuple[Callable[[dict[str, Any]], Iterator[Problem]], ...] = (_release, _events)
