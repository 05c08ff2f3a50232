"""URLs of the demo/test project: the admin (with the kumiko_jobs run browser) and django-rq's
dashboard for operators (kumiko_jobs.dashboard.urls: django-rq's pages behind kumiko's check)."""

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path
from django.views.generic import RedirectView

urlpatterns: list[URLPattern | URLResolver] = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("django-rq/", include("kumiko_jobs.dashboard.urls")),
]
