"""django-rq's URL patterns with kumiko's views and the operator check, for ``urls.py`` and for
the dashboard in the admin (``admin.py``)."""

from __future__ import annotations

from collections.abc import Callable

from django.urls import URLPattern
from django_rq.urls import get_admin_urlpatterns, get_api_urlpatterns

from kumiko_jobs.dashboard.access import View, operator_only, operator_or_token
from kumiko_jobs.dashboard.views import OVERRIDES


def dashboard_view(view: View) -> View:
    """kumiko's version of a django-rq view (if any), for operators only."""
    return operator_only(OVERRIDES.get(view, view))


def dashboard_patterns(name_prefix: str = "", wrap: Callable[[View], View] | None = None) -> list[URLPattern]:
    """All of django-rq's patterns; ``wrap`` (e.g. the admin's) goes around each guarded view."""
    outer = wrap or (lambda view: view)
    api = [
        URLPattern(p.pattern, operator_or_token(p.callback), p.default_args, p.name)
        for p in get_api_urlpatterns(name_prefix=name_prefix)
    ]
    return [
        *api,
        *get_admin_urlpatterns(name_prefix=name_prefix, view_wrapper=lambda v: outer(dashboard_view(v))),
    ]
