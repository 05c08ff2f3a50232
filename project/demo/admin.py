"""Admin for the demo tenants and their notes: read-mostly, the demo's jobs write the data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django_scopes import scopes_disabled

from project.demo.models import Note, Tenant

# ModelAdmin is generic only in django-stubs; the demo runs without django_stubs_ext too.
if TYPE_CHECKING:
    _TenantAdmin = admin.ModelAdmin[Tenant]
    _NoteAdmin = admin.ModelAdmin[Note]
else:
    _TenantAdmin = _NoteAdmin = admin.ModelAdmin


@admin.register(Tenant)
class TenantAdmin(_TenantAdmin):
    list_display = ("name", "slug", "active")
    list_filter = ("active",)
    search_fields = ("name", "slug")
    ordering = ("name",)

    def get_readonly_fields(self, request: HttpRequest, obj: Tenant | None = None) -> tuple[str, ...]:
        # The slug is an identifier other systems may hold; editing it would orphan their data.
        return ("slug",) if obj is not None else ()

    def has_delete_permission(self, request: HttpRequest, obj: Tenant | None = None) -> bool:
        # Deleting cascades to every note; deactivate the tenant instead.
        return False


@admin.register(Note)
class NoteAdmin(_NoteAdmin):
    list_display = ("text", "tenant", "created_at")
    list_filter = ("tenant",)
    list_select_related = ("tenant",)
    search_fields = ("text",)
    date_hierarchy = "created_at"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Note]:
        # Note.objects refuses queries outside a django-scopes scope. The admin is the
        # operators' cross-tenant view, so superusers read unscoped; anyone else sees nothing.
        # The scope is checked when the manager builds the queryset, so this one stays unscoped.
        with scopes_disabled():
            queryset = super().get_queryset(request)
        user: Any = request.user
        return queryset if user.is_superuser else queryset.none()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Note | None = None) -> bool:
        return False
