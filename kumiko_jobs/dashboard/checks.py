"""System checks of django-rq's dashboard (``kumiko_jobs.W111``-``W113``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from django.apps import AppConfig, apps
from django.conf import settings
from django.core.checks import CheckMessage, Tags, register
from django.core.checks import Warning as CheckWarning
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils.module_loading import import_string

from kumiko_jobs.dashboard import setup
from kumiko_jobs.dashboard.access import MARKER


@register(Tags.urls, "kumiko_jobs")
def check_dashboard_urls(app_configs: Iterable[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    if not apps.is_installed("django_rq"):
        return []
    try:
        patterns = list(get_resolver().url_patterns)
    except Exception:
        return []
    exposed = sorted({route for route, view in _walk(patterns, "") if _unguarded_django_rq_view(view)})
    if not exposed:
        return []
    return [
        CheckWarning(
            f"django-rq's dashboard is mounted without kumiko's operator check at /{exposed[0]}: any staff "
            "user, tenant staff included, can read every tenant's payloads there and delete their jobs, "
            "and its writes bypass kumiko's flows and limits.",
            hint='Mount it with path("django-rq/", include("kumiko_jobs.dashboard.urls")) instead of '
            "django_rq.urls (the admin's Django-RQ link is guarded already).",
            id="kumiko_jobs.W111",
        )
    ]


@register(Tags.compatibility, "kumiko_jobs")
def check_rq_settings(app_configs: Iterable[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    if not apps.is_installed("django_rq"):
        return []
    out: list[CheckMessage] = []
    queue_class = (getattr(settings, "RQ", None) or {}).get("QUEUE_CLASS")
    if queue_class and queue_class != setup.LANE_QUEUE_CLASS and not _is_lane_queue(queue_class):
        out.append(
            CheckWarning(
                f"RQ['QUEUE_CLASS'] = {queue_class!r} is not a kumiko_jobs LaneQueue, so django-rq's "
                "dashboard and rqstats show 0 queued jobs for the kumiko lanes.",
                hint=f"Remove it, or derive your class from {setup.LANE_QUEUE_CLASS} "
                "(it behaves as DjangoRQ for every other queue).",
                id="kumiko_jobs.W112",
            )
        )
    for name in sorted(setup.replaced_entries):
        out.append(
            CheckWarning(
                f"RQ_QUEUES[{name!r}] is a kumiko_jobs lane; kumiko_jobs replaces that entry with its own "
                "(its Redis from KUMIKO_JOBS['REDIS'], the JSON serializer).",
                hint=f"Remove RQ_QUEUES[{name!r}] from your settings.",
                id="kumiko_jobs.W113",
            )
        )
    return out


def _walk(patterns: list[URLPattern | URLResolver], prefix: str) -> Iterator[tuple[str, Any]]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _walk(list(pattern.url_patterns), route)
        else:
            yield route, pattern.callback


def _unguarded_django_rq_view(view: Any) -> bool:
    module = str(getattr(view, "__module__", ""))
    return module.startswith("django_rq.") and not getattr(view, MARKER, False)


def _is_lane_queue(path: Any) -> bool:
    from kumiko_jobs.dashboard.queue import LaneQueue

    try:
        cls = import_string(path) if isinstance(path, str) else path
    except ImportError:
        return False
    return isinstance(cls, type) and issubclass(cls, LaneQueue)
