"""Checks of Django tasks on KumikoTaskBackend (E502-E506): one id per rule, each with a hint."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import Error
from django.tasks import task

from kumiko_jobs.checks import check_definition, check_settings
from kumiko_jobs.checks.tasks import check_task_backend
from kumiko_jobs.task_jobs import build_definition_for
from tests.testapp import tasks

BACKEND = "kumiko_jobs.backends.KumikoTaskBackend"


def test_the_test_settings_are_valid() -> None:
    assert check_task_backend("default", {"BACKEND": BACKEND, "QUEUES": ["worker", "api"]}) == []
    assert check_task_backend("default", {"BACKEND": BACKEND}) == []
    assert check_task_backend("default", {"BACKEND": BACKEND, "QUEUES": ["default"], "OPTIONS": {}}) == []


@pytest.mark.parametrize(
    ("params", "code", "fragment"),
    [
        ({"QUEUES": ["worker", "low"]}, "kumiko_jobs.E502", "queue 'low' in QUEUES is not a kumiko lane"),
        ({"QUEUES": "worker"}, "kumiko_jobs.E502", "is not a list of queue names"),
        ({"QUEUES": []}, "kumiko_jobs.E503", "would turn Django's queue validation off"),
        ({"QUEUE": ["worker"]}, "kumiko_jobs.E504", "'QUEUE' is not a setting of KumikoTaskBackend"),
        ({"OPTIONS": {"prefix": "x"}}, "kumiko_jobs.E505", "KumikoTaskBackend has no options"),
    ],
)
def test_each_backend_rule_reports_its_id(params: dict[str, Any], code: str, fragment: str) -> None:
    [message] = check_task_backend("default", {"BACKEND": BACKEND, **params})
    assert isinstance(message, Error)
    assert message.id == code
    assert fragment in message.msg and message.msg.startswith("TASKS['default']: ")
    assert message.hint


def test_django_runs_the_backend_checks(settings: Any) -> None:
    from django.tasks.checks import check_tasks

    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": []}}
    assert [m.id for m in check_tasks()] == ["kumiko_jobs.E503"]


def test_bad_task_options_are_reported_like_a_jobs() -> None:
    bad = task(retries=-1, timeout=-5)(tasks.noop_task.func)
    codes = {m.id for m in check_definition(build_definition_for(bad))}
    assert codes and all(code and code.startswith("kumiko_jobs.E0") for code in codes)


@pytest.mark.parametrize("value", ["my tasks", 3])
def test_task_module_setting(settings: Any, value: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TASK_MODULE": value}
    assert [m.id for m in check_settings()] == ["kumiko_jobs.E506"]


def test_task_module_may_be_off(settings: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "TASK_MODULE": None}
    assert check_settings() == []
