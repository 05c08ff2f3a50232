"""Sidebar filters of the run browser; each lists a bounded number of choices."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from kumiko_jobs.keys import LANES
from kumiko_jobs.tenancy import tenant_model

# A sidebar of thousands of tenants or job names helps nobody; search narrows further.
CHOICES_LIMIT = 200
NO_TENANT = "-"


class JobNameFilter(admin.SimpleListFilter):
    title = "job"
    parameter_name = "job_name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # Through the admin's queryset, so tenant staff see only their own jobs' names.
        names = model_admin.get_queryset(request).order_by("job_name").values_list("job_name", flat=True)
        return [(name, name) for name in names.distinct()[:CHOICES_LIMIT]]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(job_name=self.value()) if self.value() else queryset


class LaneFilter(admin.SimpleListFilter):
    # The lanes are fixed, so listing them needs no DISTINCT over the table.
    title = "lane"
    parameter_name = "lane"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(lane, lane) for lane in LANES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(lane=self.value()) if self.value() else queryset


class TenantFilter(admin.SimpleListFilter):
    title = "tenant"
    parameter_name = "tenant"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        model = tenant_model()
        if model is not None:
            tenants = model._default_manager.order_by(*(model._meta.ordering or ["pk"]))[:CHOICES_LIMIT]
            choices = [(str(tenant.pk), f"{tenant} ({tenant.pk})") for tenant in tenants]
        else:
            runs = model_admin.get_queryset(request).exclude(tenant_id=None).order_by("tenant_id")
            ids = runs.values_list("tenant_id", flat=True).distinct()[:CHOICES_LIMIT]
            choices = [(tenant_id, tenant_id) for tenant_id in ids]
        return [*choices, (NO_TENANT, "(no tenant)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == NO_TENANT:
            return queryset.filter(tenant_id=None)
        return queryset.filter(tenant_id=self.value()) if self.value() else queryset
