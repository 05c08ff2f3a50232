"""System checks of schedules, boot and events: one id per rule, each with a hint."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import Error

from kumiko_jobs import cron, on_event
from kumiko_jobs.checks import check_definition as check_core
from kumiko_jobs.definitions import build_definition
from kumiko_jobs.scheduling.checks import check_definition, check_schedule_settings


def handler(payload: dict[str, Any], ctx: Any) -> None:
    """A module-level handler, importable as the checks require."""


def ids(events: frozenset[str] | None = None, **options: Any) -> list[str]:
    return [m.id or "" for m in check_definition(build_definition(handler, "t.job", options), events)]


def test_valid_schedule_declarations_pass() -> None:
    definition = build_definition(
        handler, "t.job", {"trigger": cron("0 7 * * *", tz="tenant"), "per_tenant": True, "spread": 600}
    )
    assert check_definition(definition) == []
    assert check_core(definition) == []  # "tenant" is a zone the core check accepts


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
def test_each_rule_reports_its_id(options: dict[str, Any], code: str) -> None:
    assert ids(**options) == [code]


def test_tenant_zone_message_and_hint() -> None:
    [error] = check_definition(
        build_definition(handler, "t.job", {"trigger": cron("0 7 * * *", tz="tenant")})
    )
    assert error == Error(
        "Job 't.job': cron(..., tz=\"tenant\") needs per_tenant=True: "
        "only a tenant's own run has a local time.",
        hint='Declare per_tenant=True, or give an IANA zone such as tz="Europe/Berlin".',
        obj="tests.scheduling.test_checks.handler",
        id="kumiko_jobs.E203",
    )


def test_trigger_on_an_undeclared_event() -> None:
    events = frozenset({"invoice.created", "invoice.paid"})
    [error] = check_definition(
        build_definition(handler, "t.job", {"trigger": on_event("invoice.craeted")}), events
    )
    assert error.id == "kumiko_jobs.E208"
    assert "on_event('invoice.craeted')" in error.msg
    assert error.hint and error.hint.startswith("Did you mean: invoice.created, invoice.paid?")
    assert ids(events, trigger=on_event("invoice.paid")) == []
    assert ids(None, trigger=on_event("anything.goes")) == []


@pytest.mark.parametrize(
    ("override", "code", "fragment"),
    [
        ({"TENANT_TIMEZONE": "nowhere.zone_of"}, "kumiko_jobs.E205", "TENANT_TIMEZONE"),
        ({"CRON_CATCH_UP": 0}, "kumiko_jobs.E206", "CRON_CATCH_UP"),
        ({"ORPHAN_GRACE": -5}, "kumiko_jobs.E206", "ORPHAN_GRACE"),
        ({"TENANT_ZONE_REFRESH": "5m"}, "kumiko_jobs.E206", "TENANT_ZONE_REFRESH"),
        ({"BOOT_GATE_WARN_AFTER": True}, "kumiko_jobs.E206", "BOOT_GATE_WARN_AFTER"),
        ({"RELEASE": 7}, "kumiko_jobs.E207", "RELEASE"),
        ({"EVENTS": "invoice.created"}, "kumiko_jobs.E209", "EVENTS"),
        ({"EVENTS": ["ok", ""]}, "kumiko_jobs.E209", "EVENTS"),
    ],
)
def test_settings_checks(settings: Any, override: dict[str, Any], code: str, fragment: str) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, **override}
    messages = check_schedule_settings()
    assert [m.id for m in messages] == [code]
    assert fragment in messages[0].msg and messages[0].hint


def test_default_settings_pass(settings: Any) -> None:
    assert check_schedule_settings() == []
