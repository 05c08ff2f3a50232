"""URLs of the demo/test project: the admin (with the kumiko_jobs console), django-rq's
dashboard for operators (kumiko_jobs.dashboard.urls: django-rq's pages behind kumiko's check),
a view that dispatches from a request, the Prometheus scrape endpoint, and a tenant's own jobs
page."""

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path
from django.views.generic import RedirectView

from project.demo import views
from project.demo.tenant_views import tenant_jobs

urlpatterns: list[URLPattern | URLResolver] = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("django-rq/", include("kumiko_jobs.dashboard.urls")),
    path("demo/<slug:slug>/notes/", views.write_note, name="demo-write-note"),
    path("metrics", views.prometheus_metrics, name="metrics"),
    path("tenants/<slug:slug>/jobs/", tenant_jobs, name="tenant-jobs"),
]
