"""django-rq's link in the admin ("Django-RQ"), for operators only.

django-rq registers its dashboard with the default admin site for any staff user; this
replaces that registration (``install()``, called from ``AppConfig.ready()``) with one whose
module link and pages only operators see, serving the same pages as ``urls.py``.
"""

from __future__ import annotations

from functools import wraps
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern
from django_rq.admin import QueueAdmin
from django_rq.models import Dashboard

from kumiko_jobs.dashboard.access import View, is_dashboard_operator, operator_only
from kumiko_jobs.dashboard.patterns import dashboard_patterns
from kumiko_jobs.dashboard.views import stats


class OperatorQueueAdmin(QueueAdmin):
    def has_module_permission(self, request: HttpRequest) -> bool:
        return is_dashboard_operator(request.user)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_dashboard_operator(request.user)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_dashboard_operator(request.user)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return operator_only(stats)(request)

    def get_urls(self) -> list[URLPattern]:
        def in_admin(view: View) -> View:
            @wraps(view)
            def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                request.current_app = self.admin_site.name
                return self.admin_site.admin_view(view)(request, *args, **kwargs)

            return wrapper

        # Skip QueueAdmin.get_urls (django-rq's unguarded views); keep ModelAdmin's own.
        model_urls = admin.ModelAdmin.get_urls(self)
        return [*dashboard_patterns(name_prefix="django_rq_", wrap=in_admin), *model_urls]


def install(site: admin.AdminSite = admin.site) -> None:
    """Swap django-rq's registration (if it made one: ``RQ_SHOW_ADMIN_LINK``) for ours."""
    if site.is_registered(Dashboard) and not isinstance(site.get_model_admin(Dashboard), OperatorQueueAdmin):
        site.unregister(Dashboard)
        site.register(Dashboard, OperatorQueueAdmin)
