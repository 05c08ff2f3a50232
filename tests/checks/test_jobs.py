"""Job declaration checks: each rule reports one error with its own stable id and a hint."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import Error
from django.core.management import call_command

from kumiko_jobs import (
    Backoff,
    EscapeHatch,
    MaxPerTenant,
    TenantVisibleFailure,
    TenantVisibleRun,
    cron,
    job,
    on_event,
)
from kumiko_jobs.checks import check_definition, check_jobs
from kumiko_jobs.definitions import EventTrigger
from kumiko_jobs.registry import build_definition, registry


def handler(payload: dict[str, Any], ctx: Any) -> None:
    """A module-level handler, importable as the checks require."""


def ids(**options: Any) -> list[str]:
    return [m.id or "" for m in check_definition(build_definition(handler, "t.job", options))]


def test_replace_with_a_defer_cap_per_tenant_is_valid() -> None:
    assert ids(concurrency="replace", max_per_tenant=MaxPerTenant(2, "defer")) == []


def test_valid_declaration_has_no_errors() -> None:
    assert (
        ids(
            trigger=[cron("0 7 * * *", tz="Europe/Berlin"), on_event("a.b", where={"k": 1})],
            lane="api",
            retries=3,
            backoff="exponential",
            timeout=30,
            max_per_tenant=MaxPerTenant(2, "defer", 500),
            escape_hatch=EscapeHatch("nightly export", grants=("unscoped",)),
            max_defers=0,
            concurrency="sequential",
            tenant_visible_run=TenantVisibleRun(("invoice_id",)),
            tenant_visible_failure=TenantVisibleFailure("billing.export_failed"),
        )
        == []
    )


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"lane": "both"}, "kumiko_jobs.E001"),
        ({"trigger": cron("0 7 * *")}, "kumiko_jobs.E003"),
        ({"trigger": cron("61 7 * * *")}, "kumiko_jobs.E003"),
        ({"trigger": cron("0 7 * * *", tz="Mars/Olympus")}, "kumiko_jobs.E004"),
        ({"escape_hatch": EscapeHatch("  ")}, "kumiko_jobs.E005"),
        ({"escape_hatch": EscapeHatch("why", grants=("root",))}, "kumiko_jobs.E006"),
        ({"escape_hatch": EscapeHatch("why", grants=())}, "kumiko_jobs.E006"),
        ({"boot_gate": True, "run_on_boot": True}, "kumiko_jobs.E007"),
        ({"max_per_tenant": 0}, "kumiko_jobs.E008"),
        ({"max_per_tenant": MaxPerTenant(2, "queue")}, "kumiko_jobs.E008"),  # type: ignore[arg-type]
        ({"max_per_tenant": MaxPerTenant(2, "defer", 0)}, "kumiko_jobs.E008"),
        ({"backoff": "linear"}, "kumiko_jobs.E009"),
        ({"backoff": Backoff("fixed", delay_ms=-1)}, "kumiko_jobs.E009"),
        ({"timeout": 0}, "kumiko_jobs.E010"),
        ({"timeout": "5m"}, "kumiko_jobs.E010"),
        ({"max_defers": -1}, "kumiko_jobs.E011"),
        ({"retries": -1}, "kumiko_jobs.E014"),
        ({"retries": 1.5}, "kumiko_jobs.E014"),
        ({"concurrency": "exclusive"}, "kumiko_jobs.E015"),
        ({"concurrency_scope": "tenants"}, "kumiko_jobs.E022"),
        ({"debounce_ms": 0}, "kumiko_jobs.E023"),
        ({"trigger": on_event([])}, "kumiko_jobs.E016"),
        ({"trigger": EventTrigger(("a",), where="kind=refund")}, "kumiko_jobs.E024"),  # type: ignore[arg-type]
        ({"trigger": "daily"}, "kumiko_jobs.E025"),
        (
            {
                "concurrency": "replace",
                "concurrency_scope": "job",
                "max_per_tenant": MaxPerTenant(2, "defer"),
            },
            "kumiko_jobs.E026",
        ),
        (
            {
                "tenant_visible_run": TenantVisibleRun(("invoice_id",)),
                "tenant_visible_failure": TenantVisibleFailure("k", ("order_id",)),
            },
            "kumiko_jobs.E301",
        ),
        ({"tenant_visible_run": TenantVisibleRun("invoice_id")}, "kumiko_jobs.E302"),  # type: ignore[arg-type]
        ({"tenant_visible_run": ("invoice_id",)}, "kumiko_jobs.E302"),
        ({"tenant_visible_failure": TenantVisibleFailure(" ")}, "kumiko_jobs.E303"),
        ({"tenant_visible_failure": TenantVisibleFailure("k", ("",))}, "kumiko_jobs.E303"),
        ({"per_tenant": True, "retries": 40, "backoff": "exponential"}, "kumiko_jobs.E304"),
    ],
)
def test_each_rule_reports_its_id(options: dict[str, Any], code: str) -> None:
    assert ids(**options) == [code]


def test_error_message_and_hint_are_exact() -> None:
    [error] = check_definition(build_definition(handler, "t.job", {"lane": "both"}))
    assert error == Error(
        "Job 't.job': lane 'both' is not allowed.",
        hint='Use lane="api" (short, CPU-light jobs) or "worker".',
        obj="tests.checks.test_jobs.handler",
        id="kumiko_jobs.E001",
    )


def test_nested_handler_is_not_importable() -> None:
    def nested(payload: dict[str, Any], ctx: Any) -> None: ...

    assert [m.id for m in check_definition(build_definition(nested, "t.nested", {}))] == ["kumiko_jobs.E012"]


def payload_only(payload: dict[str, Any]) -> None:
    """A handler that forgot ctx."""


def keyword_only(*, payload: dict[str, Any], ctx: Any) -> None:
    """Keyword-only parameters: the worker passes them by position."""


def flexible(payload: dict[str, Any], *args: Any, **kwargs: Any) -> None:
    """Takes (payload, ctx) through *args."""


def with_default(payload: dict[str, Any], ctx: Any = None, extra: int = 0) -> None:
    """A third parameter with a default."""


@pytest.mark.parametrize("func", [payload_only, keyword_only])
def test_a_handler_that_cannot_take_payload_and_ctx_is_reported(func: Any) -> None:
    (error,) = check_definition(build_definition(func, "t.sig", {}))
    assert error.id == "kumiko_jobs.E036"
    assert (
        f"handler {func.__name__!r}(" in error.msg
        and "cannot be called as handler(payload, ctx)" in error.msg
    )
    assert error.hint == "Give it two positional parameters: def handler(payload, ctx): ..."


@pytest.mark.parametrize("func", [flexible, with_default])
def test_handlers_that_take_payload_and_ctx_in_other_shapes_pass(func: Any) -> None:
    assert check_definition(build_definition(func, "t.sig", {})) == []


def test_per_tenant_without_active_tenants(settings: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "ACTIVE_TENANTS": None}
    assert ids(per_tenant=True) == ["kumiko_jobs.E017"]


def test_duplicate_names_are_reported() -> None:
    with registry.isolated():
        job(name="dup.one")(handler)
        job(name="dup.one")(test_duplicate_names_are_reported)  # type: ignore[arg-type]
        errors = [m for m in check_jobs() if m.id == "kumiko_jobs.E002"]
    assert len(errors) == 1 and "Duplicate job name 'dup.one'" in errors[0].msg


def test_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['retry'\]"):
        build_definition(handler, "t.job", {"retry": 3})


@pytest.mark.django_db
def test_project_passes_manage_py_check() -> None:
    call_command("check", "--fail-level", "WARNING")
