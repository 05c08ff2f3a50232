"""System checks of django-rq's dashboard: kumiko_jobs.W111-W113, one test per id."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings

from kumiko_jobs.connection import get_keys
from kumiko_jobs.dashboard import setup
from kumiko_jobs.dashboard.checks import check_dashboard_urls, check_rq_settings
from kumiko_jobs.dashboard.queue import LaneQueue


class ProjectQueue(LaneQueue):
    """A project's own queue class that keeps the lanes' view."""


def test_project_urls_and_settings_pass() -> None:
    assert check_dashboard_urls() == []
    assert check_rq_settings() == []


def test_w111_django_rq_urls_mounted_without_the_operator_check(settings: Any) -> None:
    settings.ROOT_URLCONF = "tests.unguarded_urls"
    messages = check_dashboard_urls()
    assert [m.id for m in messages] == ["kumiko_jobs.W111"]
    assert "/rq/" in messages[0].msg and "kumiko_jobs.dashboard.urls" in (messages[0].hint or "")


def test_w112_a_queue_class_that_hides_the_lanes(settings: Any) -> None:
    settings.RQ = {"QUEUE_CLASS": "django_rq.queues.DjangoRQ"}
    messages = check_rq_settings()
    assert [m.id for m in messages] == ["kumiko_jobs.W112"]
    settings.RQ = {"QUEUE_CLASS": f"{__name__}.ProjectQueue"}
    assert check_rq_settings() == []


def test_w113_a_lane_defined_in_rq_queues_is_replaced(settings: Any) -> None:
    name = get_keys().queue_name("worker")
    settings.RQ_QUEUES = {name: {"URL": "redis://elsewhere:6379/0"}, "reports": {"URL": "redis://r:6379/0"}}
    messages = check_rq_settings()
    assert [m.id for m in messages] == ["kumiko_jobs.W113"]
    assert name in messages[0].msg
    # The lane entry is kumiko's (its Redis, JSON); the project's own queue is left alone.
    assert django_settings.RQ_QUEUES[name][setup.MARK] == "worker"
    assert django_settings.RQ_QUEUES[name]["SERIALIZER"] == "rq.serializers.JSONSerializer"
    assert django_settings.RQ_QUEUES["reports"] == {"URL": "redis://r:6379/0"}


def test_supplied_settings_follow_the_prefix_and_the_redis_setting(settings: Any) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "QUEUE_PREFIX": "other", "REDIS": "cache:default"}
    assert sorted(django_settings.RQ_QUEUES) == ["other:api", "other:worker"]
    assert django_settings.RQ_QUEUES["other:api"]["USE_REDIS_CACHE"] == "default"
    assert django_settings.RQ["QUEUE_CLASS"] == setup.LANE_QUEUE_CLASS
