"""URLs of the demo/test project: the admin (with the kumiko_jobs console), django-rq's dashboard
for operators (kumiko_jobs.dashboard.urls: django-rq's pages behind kumiko's check), and a
tenant's own jobs page."""

from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path
from django.views.generic import RedirectView

from project.demo.views import tenant_jobs

urlpatterns: list[URLPattern | URLResolver] = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("django-rq/", include("kumiko_jobs.dashboard.urls")),
    path("tenants/<slug:slug>/jobs/", tenant_jobs, name="tenant-jobs"),
]
