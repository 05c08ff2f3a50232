"""Tenant failure records: operators see all, tenant staff their tenant's (what its users see)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from kumiko_jobs.admin.access import is_operator, staff_tenant_id
from kumiko_jobs.admin.run_columns import run_url
from kumiko_jobs.models import TenantFailure
from kumiko_jobs.registry import registry

STAFF_LOOKUPS = frozenset({"job_name"})


class FailingJobFilter(admin.SimpleListFilter):
    # The declared jobs, not a DISTINCT over the table.
    title = "job"
    parameter_name = "job_name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = sorted(d.name for d in registry.all() if d.tenant_visible_failure is not None)
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(job_name=self.value()) if self.value() else queryset


# ModelAdmin is generic only in django-stubs (see audits.py).
if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[TenantFailure]
else:
    _ModelAdmin = admin.ModelAdmin


@admin.register(TenantFailure)
class TenantFailureAdmin(_ModelAdmin):
    list_display = (
        "message_key", "job_name", "tenant_id", "subject", "count", "first_failed_at", "last_failed_at",
        "last_run",
    )  # fmt: skip
    staff_list_display = ("message_key", "job_name", "subject", "count", "first_failed_at", "last_failed_at")
    list_filter = (FailingJobFilter,)
    ordering = ("-last_failed_at",)
    list_per_page = 100
    show_full_result_count = False
    fields = ("message_key", "job_name", "tenant_id", "subject", "count", "first_failed_at", "last_failed_at",
              "last_run")  # fmt: skip
    readonly_fields = ("last_run",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[TenantFailure]:
        queryset = super().get_queryset(request)
        if is_operator(request):
            return queryset
        tenant = staff_tenant_id(request)
        return queryset.none() if tenant is None else queryset.filter(tenant_id=tenant).defer("last_run_id")

    def get_list_display(self, request: HttpRequest) -> Any:
        return self.list_display if is_operator(request) else self.staff_list_display

    def get_fields(self, request: HttpRequest, obj: TenantFailure | None = None) -> Any:
        return self.fields if is_operator(request) else self.staff_list_display

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        return lookup in STAFF_LOOKUPS or (is_operator(request) and lookup in {"tenant_id", "subject"})

    @admin.display(description="last failed run")
    def last_run(self, failure: TenantFailure) -> SafeString | str:
        if failure.last_run_id is None:
            return "-"
        return format_html('<a href="{}">{}</a>', run_url(failure.last_run_id), failure.last_run_id)

    def has_view_permission(self, request: HttpRequest, obj: TenantFailure | None = None) -> bool:
        allowed = super().has_view_permission(request, obj)
        return allowed and (is_operator(request) or staff_tenant_id(request) is not None)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: TenantFailure | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: TenantFailure | None = None) -> bool:
        return False
