"""Optional activator for django-tenants (one PostgreSQL schema per tenant).

Set ``KUMIKO_JOBS["TENANT_ACTIVATOR"] = "kumiko_jobs.tenancy_schemas.schema_activator"`` and
install the extra: ``pip install kumiko_jobs[tenants]``. Tenant-less runs use the public schema.
Tenant ids are the tenant model's primary keys (what ``ACTIVE_TENANTS`` returns and
``dispatch(tenant=...)`` takes); kumiko_jobs belongs in ``SHARED_APPS`` only, so its run records
stay in the public schema whichever schema a handler runs in.

An ``async def`` handler's ORM calls run on its job thread's database thread, which has its own
connection: async_handlers.py enters the activator there too, before the job's first call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from django.db import models

from kumiko_jobs.exceptions import InvalidTenant
from kumiko_jobs.tenancy import tenant_context


@contextmanager
def schema_activator(tenant_id: str | None) -> Iterator[None]:
    """Activate the tenant's schema (django-tenants) and the tenant context variable."""
    try:
        from django_tenants.utils import (
            get_public_schema_name,
            get_tenant_database_alias,
            get_tenant_model,
            schema_context,
        )
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
            schema = _schema_of(tenant_id, get_tenant_model(), get_tenant_database_alias())
        stack.enter_context(schema_context(schema))
        yield


def _schema_of(tenant_id: str, model: type[models.Model], alias: str) -> str:
    # One primary-key lookup per run, on the database whose schemas django-tenants switches.
    # The tenant table is shared (public), so the connection's current schema does not matter.
    schemas = model._default_manager.using(alias).values_list("schema_name", flat=True)
    schema: str | None = schemas.filter(pk=tenant_id).first()
    if schema is None:
        raise InvalidTenant(
            f"Tenant {tenant_id!r} does not exist ({model._meta.label}): its run cannot pick a "
            "schema. It was deleted after the run was dispatched; the run fails instead of running "
            "in another schema."
        )
    return schema
