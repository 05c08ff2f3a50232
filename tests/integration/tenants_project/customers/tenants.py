"""ACTIVE_TENANTS: every tenant but the public schema's (django-tenants' convention)."""

from collections.abc import Iterator

from django_tenants.utils import get_public_schema_name

from tests.integration.tenants_project.customers.models import Client


def active_tenant_ids() -> Iterator[int]:
    return (
        Client.objects.exclude(schema_name=get_public_schema_name())
        .order_by("pk")
        .values_list("pk", flat=True)
        .iterator()
    )
