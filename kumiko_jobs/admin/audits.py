"""Escape-hatch audits: a read-only list for operators."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.http import HttpRequest

from kumiko_jobs.admin.access import is_operator
from kumiko_jobs.models import EscapeHatchAudit

# ModelAdmin is generic only in django-stubs: subscripting it at run time needs
# django_stubs_ext.monkeypatch(), which a user's project does not call.
if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[EscapeHatchAudit]
else:
    _ModelAdmin = admin.ModelAdmin


@admin.register(EscapeHatchAudit)
class EscapeHatchAuditAdmin(_ModelAdmin):
    list_display = (
        "job_name", "tenant_id", "kind", "reason", "actor", "caller", "count", "first_seen", "last_seen",
    )  # fmt: skip
    list_filter = ("kind", "job_name")
    search_fields = ("job_name",)
    ordering = ("-last_seen",)
    list_per_page = 100

    # Operators only, whatever model permissions staff hold: audits name every tenant.
    def has_module_permission(self, request: HttpRequest) -> bool:
        return is_operator(request)

    def has_view_permission(self, request: HttpRequest, obj: EscapeHatchAudit | None = None) -> bool:
        return is_operator(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: EscapeHatchAudit | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: EscapeHatchAudit | None = None) -> bool:
        return False
