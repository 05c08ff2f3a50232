"""Settings checks: every KUMIKO_JOBS key a worker reads is validated, one id per rule."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import Error
from django.core.checks import Warning as CheckWarning

from kumiko_jobs.checks import check_settings


def scrub_to_none(text: str) -> None:
    """A broken SCRUBBER: forgets to return the text."""


def scrub_raises(text: str) -> str:
    raise RuntimeError("broken scrubber")


@pytest.mark.parametrize(
    ("override", "code", "fragment"),
    [
        ({"QUEUE_PREFIX": "bad prefix!"}, "kumiko_jobs.E018", "QUEUE_PREFIX"),
        ({"ACTIVE_TENANTS": "nowhere.tenants"}, "kumiko_jobs.E019", "ACTIVE_TENANTS"),
        ({"USER_TENANT": 42}, "kumiko_jobs.E019", "it is not callable"),
        ({"TENANT_MODEL": "demo.Nope"}, "kumiko_jobs.E020", "TENANT_MODEL"),
        ({"TENANT_MODEL": "no_dot"}, "kumiko_jobs.E020", "TENANT_MODEL"),
        ({"FAILURE_TTL": 0}, "kumiko_jobs.E021", "FAILURE_TTL"),
        ({"RESULT_TTL": -1}, "kumiko_jobs.E033", "RESULT_TTL"),
        ({"RESULT_TTL": 1.5}, "kumiko_jobs.E033", "RESULT_TTL"),
        ({"REDIS_TIMEOUT": float("inf")}, "kumiko_jobs.E021", "REDIS_TIMEOUT"),
        ({"TENANT_CACHE_SECONDS": "60"}, "kumiko_jobs.E021", "TENANT_CACHE_SECONDS"),
        ({"RUNNING_MARK_DELAY": -1}, "kumiko_jobs.E027", "RUNNING_MARK_DELAY"),
        ({"HEARTBEAT_INTERVAL": 20, "ABANDON_AFTER": 30}, "kumiko_jobs.E028", "twice HEARTBEAT_INTERVAL"),
        ({"AUDIT_WINDOW": 0}, "kumiko_jobs.E029", "AUDIT_WINDOW"),
        ({"AUDIT_WINDOW": 1.5}, "kumiko_jobs.E029", "AUDIT_WINDOW"),
        ({"ABANDONED_RETRIES": "x"}, "kumiko_jobs.E030", "ABANDONED_RETRIES"),
        ({"ABANDONED_RETRIES": -1}, "kumiko_jobs.E030", "ABANDONED_RETRIES"),
        ({"JOB_MODULE": "my jobs"}, "kumiko_jobs.E031", "JOB_MODULE"),
        ({"JOB_MODULE": None}, "kumiko_jobs.E031", "JOB_MODULE"),
        ({"RUN_RETENTION": 60}, "kumiko_jobs.E305", "RUN_RETENTION"),
        ({"AUDIT_RETENTION": 86400.5}, "kumiko_jobs.E305", "AUDIT_RETENTION"),
        ({"SCRUBBER": "nowhere.scrub"}, "kumiko_jobs.E401", "SCRUBBER"),
        ({"SCRUBBER": 42}, "kumiko_jobs.E401", "it is not callable"),
        ({"SCRUBBER": "tests.checks.test_settings.scrub_to_none"}, "kumiko_jobs.E402", "returned None"),
        ({"SCRUBBER": "tests.checks.test_settings.scrub_raises"}, "kumiko_jobs.E402", "raised"),
        ({"LOG_JOB_LINES": "yes"}, "kumiko_jobs.E403", "LOG_JOB_LINES"),
        ({"PIPELINED_WRITES": 1}, "kumiko_jobs.E035", "PIPELINED_WRITES"),
        ({"QUEUE_PREFIXX": "x"}, "kumiko_jobs.W001", "not a known setting"),
    ],
)
def test_each_rule_reports_its_id(settings: Any, override: dict[str, Any], code: str, fragment: str) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, **override}
    messages = check_settings()
    assert [m.id for m in messages] == [code]
    assert fragment in messages[0].msg and messages[0].hint
    assert isinstance(messages[0], CheckWarning if code.endswith("W001") else Error)


def test_message_and_hint_are_exact(settings: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "AUDIT_WINDOW": 0}
    assert check_settings() == [
        Error(
            "KUMIKO_JOBS['AUDIT_WINDOW'] = 0 must be whole seconds >= 1.",
            hint=(
                "One escape-hatch audit row is written per job, tenant and kind per window; "
                "the default is 60."
            ),
            id="kumiko_jobs.E029",
        )
    ]


def test_defaults_pass(settings: Any) -> None:
    settings.KUMIKO_JOBS = {}
    assert check_settings() == []


def test_no_scrubber_and_logged_job_lines_pass(settings: Any) -> None:
    settings.KUMIKO_JOBS = {"SCRUBBER": None, "LOG_JOB_LINES": True}
    assert check_settings() == []


def test_kumiko_jobs_in_django_tenants_tenant_apps_is_an_error(settings: Any) -> None:
    settings.TENANT_APPS = ["notes", "kumiko_jobs"]
    [message] = check_settings()
    assert (message.id, isinstance(message, Error)) == ("kumiko_jobs.E034", True)
    assert "TENANT_APPS" in message.msg and "SHARED_APPS only" in (message.hint or "")
    settings.TENANT_APPS = ["notes"]
    assert check_settings() == []


def test_a_hook_module_that_raises_on_import_is_reported(settings: Any) -> None:
    """Only ImportError was caught: any other error crashed the check, and with it every
    management command (checks run before runjobs and jobs)."""
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "USER_TENANT": "tests.testapp.broken_hook.tenant_of"}
    [message] = check_settings()
    assert message.id == "kumiko_jobs.E019" and "the tenant directory is not reachable" in message.msg


def test_an_empty_hook_is_unset_as_the_runtime_reads_it(settings: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TENANT_TIMEZONE": "", "SCRUBBER": ""}
    assert check_settings() == []
