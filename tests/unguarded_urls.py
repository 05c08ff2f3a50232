"""A URLconf that mounts django-rq's own urls (no operator check): check kumiko_jobs.W111."""

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path

urlpatterns: list[URLPattern | URLResolver] = [
    path("admin/", admin.site.urls),
    path("rq/", include("django_rq.urls")),
]
