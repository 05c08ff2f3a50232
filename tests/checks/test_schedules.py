"""Checks of schedules, boot and events: one id per rule, each with a hint."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import Error

from kumiko_jobs import cron, on_event
from kumiko_jobs.checks import check_definition, check_settings
from kumiko_jobs.registry import build_definition


def handler(payload: dict[str, Any], ctx: Any) -> None:
    """A module-level handler, importable as the checks require."""


def ids(**options: Any) -> list[str]:
    return [m.id or "" for m in check_definition(build_definition(handler, "t.job", options))]


def test_valid_schedule_declarations_pass() -> None:
    assert ids(trigger=cron("0 7 * * *", tz="tenant"), per_tenant=True, spread=600) == []
    assert ids(trigger=cron("*/5 * * * * *", tz="Asia/Kolkata"), boot_gate=True) == []


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"per_tenant": True, "spread": -1}, "kumiko_jobs.E201"),
        ({"per_tenant": True, "spread": "10m"}, "kumiko_jobs.E201"),
        ({"per_tenant": True, "spread": True}, "kumiko_jobs.E201"),
        ({"spread": 60}, "kumiko_jobs.E202"),
        ({"trigger": cron("0 7 * * *", tz="tenant")}, "kumiko_jobs.E203"),
        ({"boot_gate": True, "per_tenant": True}, "kumiko_jobs.E204"),
    ],
)
def test_each_job_rule_reports_its_id(options: dict[str, Any], code: str) -> None:
    assert ids(**options) == [code]


def test_tenant_zone_message_and_hint() -> None:
    local = {"trigger": cron("0 7 * * *", tz="tenant")}
    assert check_definition(build_definition(handler, "t.job", local)) == [
        Error(
            "Job 't.job': cron(..., tz=\"tenant\") needs per_tenant=True: "
            "only a tenant's own run has a local time.",
            hint='Declare per_tenant=True, or give an IANA zone such as tz="Europe/Berlin".',
            obj="tests.checks.test_schedules.handler",
            id="kumiko_jobs.E203",
        )
    ]


def test_trigger_on_an_undeclared_event(settings: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "EVENTS": ["invoice.created", "user.signed_up"]}

    [error] = check_definition(build_definition(handler, "t.job", {"trigger": on_event("invoice.craeted")}))

    assert error.id == "kumiko_jobs.E207"
    assert "on_event('invoice.craeted') names an event missing from KUMIKO_JOBS['EVENTS']" in error.msg
    assert error.hint == "Did you mean: invoice.created? Fix the name, or add it to KUMIKO_JOBS['EVENTS']."
    assert ids(trigger=on_event("user.signed_up")) == []


def test_any_event_goes_without_declared_events() -> None:
    assert ids(trigger=on_event("anything.goes")) == []


@pytest.mark.parametrize(
    ("override", "code", "fragment"),
    [
        ({"TENANT_TIMEZONE": "nowhere.zone_of"}, "kumiko_jobs.E019", "TENANT_TIMEZONE"),
        ({"CRON_CATCH_UP": 0}, "kumiko_jobs.E021", "CRON_CATCH_UP"),
        ({"ORPHAN_GRACE": -5}, "kumiko_jobs.E021", "ORPHAN_GRACE"),
        ({"TENANT_ZONE_REFRESH": "5m"}, "kumiko_jobs.E021", "TENANT_ZONE_REFRESH"),
        ({"BOOT_GATE_WARN_AFTER": True}, "kumiko_jobs.E021", "BOOT_GATE_WARN_AFTER"),
        ({"RELEASE": 7}, "kumiko_jobs.E205", "RELEASE"),
        ({"RELEASE": "x" * 101}, "kumiko_jobs.E205", "RELEASE"),
        ({"EVENTS": "invoice.created"}, "kumiko_jobs.E206", "EVENTS"),
        ({"EVENTS": ["ok", ""]}, "kumiko_jobs.E206", "EVENTS"),
    ],
)
def test_each_setting_rule_reports_its_id(
    settings: Any, override: dict[str, Any], code: str, fragment: str
) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, **override}
    messages = check_settings()
    assert [m.id for m in messages] == [code]
    assert fragment in messages[0].msg and messages[0].hint
