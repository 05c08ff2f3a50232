"""django-rq's dashboard for operators only: ``path("django-rq/", include("kumiko_jobs.dashboard.urls"))``.

The same URL names as ``django_rq.urls`` (namespace ``django_rq``), so django-rq's templates
work unchanged; every view is behind the operator check (``access.py``) and the writes on
kumiko lanes go through kumiko's API (``views.py``).
"""

from __future__ import annotations

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.urls import URLPattern

if not apps.is_installed("django_rq"):
    raise ImproperlyConfigured(
        "kumiko_jobs.dashboard.urls serves django-rq's dashboard: add 'django_rq' to INSTALLED_APPS."
    )

from kumiko_jobs.dashboard.patterns import dashboard_patterns

app_name = "django_rq"
urlpatterns: list[URLPattern] = dashboard_patterns()
