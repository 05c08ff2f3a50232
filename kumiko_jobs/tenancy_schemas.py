"""Optional activator for django-tenants (one PostgreSQL schema per tenant).

Set ``KUMIKO_JOBS["TENANT_ACTIVATOR"] = "kumiko_jobs.tenancy_schemas.schema_activator"`` and
install the extra: ``pip install kumiko_jobs[tenants]``. Tenant-less runs use the public schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from kumiko_jobs.tenancy import tenant_context


@contextmanager
def schema_activator(tenant_id: str | None) -> Iterator[None]:
    """Activate the tenant's schema (django-tenants) and the tenant context variable."""
    try:
        from django_tenants.utils import get_public_schema_name, get_tenant_model, schema_context
    except ImportError as exc:
        raise RuntimeError(
            "schema_activator needs django-tenants: pip install 'kumiko_jobs[tenants]', or use "
            "the default TENANT_ACTIVATOR 'kumiko_jobs.tenancy.scopes_activator'."
        ) from exc
    with ExitStack() as stack:
        stack.enter_context(tenant_context(tenant_id))
        if tenant_id is None:
            schema = get_public_schema_name()
        else:
            tenants = get_tenant_model()._default_manager
            schema = tenants.values_list("schema_name", flat=True).get(pk=tenant_id)
        stack.enter_context(schema_context(schema))
        yield
