"""Who sees what: operators, tenant staff, and tenant display names.

Operators (superusers) see every run with its payload, error, traceback and logs. Tenant staff
(a user whose ``USER_TENANT`` hook names a tenant) see only their tenant's tenant-visible runs
and failure records, and of a run only ``STAFF_RUN_FIELDS``; this is enforced in the admin's
querysets, object lookups, allowed filter lookups and actions, not only in what a page shows.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from weakref import WeakKeyDictionary

from django.core.exceptions import ValidationError
from django.http import HttpRequest

from kumiko_jobs.conf import import_setting
from kumiko_jobs.exceptions import InvalidTenant
from kumiko_jobs.tenancy import tenant_key, tenant_model
from kumiko_jobs.tenant_history import TENANT_RUN_FIELDS

_staff_tenants: WeakKeyDictionary[HttpRequest, str | None] = WeakKeyDictionary()

# What of a run tenant staff may load: TENANT_RUN_FIELDS plus the tenant (their own).
STAFF_RUN_FIELDS = (*TENANT_RUN_FIELDS, "tenant_id")


def is_operator(request: HttpRequest) -> bool:
    return bool(getattr(request.user, "is_superuser", False))


class OperatorPage:
    """Permissions of a page only operators open and nobody edits through (the overview, the job
    catalog): put it before ``ModelAdmin`` in the bases."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return is_operator(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return is_operator(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def staff_tenant_id(request: HttpRequest) -> str | None:
    """The tenant of the request's user from the ``USER_TENANT`` hook, or None.

    Cached per request: permissions, queryset and filters all ask, and the hook may query.
    """
    if request not in _staff_tenants:
        hook = import_setting("USER_TENANT")
        tenant = hook(request.user) if hook else None
        # As run records keep the id: a hook may return an instance, an int, or another
        # spelling of the key (" 1", "01", an upper-case UUID), which matched no run.
        _staff_tenants[request] = None if tenant is None else _key(tenant)
    return _staff_tenants[request]


def _key(tenant: Any) -> str:
    try:
        return tenant_key(tenant)
    except InvalidTenant:
        return str(getattr(tenant, "pk", tenant))  # matches nothing, as before


def tenant_names(tenant_ids: Iterable[str | None]) -> dict[str, str]:
    """Display names of these tenants, in one query; empty without ``TENANT_MODEL``."""
    model = tenant_model()
    if model is None or model._meta.pk is None:
        return {}
    keys = []
    for tenant_id in {t for t in tenant_ids if t}:
        try:
            keys.append(model._meta.pk.to_python(tenant_id))
        except ValidationError:
            continue  # an id the model's key cannot hold: the run is shown by id alone
    return {str(tenant.pk): str(tenant) for tenant in model._default_manager.filter(pk__in=keys)}
