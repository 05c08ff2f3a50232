"""What the test runs in the project (``manage.py shell -c``): tenants, then dispatches."""

import json

from kumiko_jobs import dispatch
from tests.integration.tenants_project.customers.models import Client, Domain

TENANTS = ("alpha", "beta")


def create_tenants() -> None:
    """Two tenants, each with its schema (created and migrated by save()); prints their ids."""
    ids = {}
    for slug in TENANTS:
        client = Client(schema_name=f"tenant_{slug}", name=slug)
        client.save(verbosity=0)
        Domain.objects.create(domain=f"{slug}.example.test", tenant=client, is_primary=True)
        ids[slug] = client.pk
    print(json.dumps(ids))


def _tenants() -> list[Client]:
    return list(Client.objects.filter(name__in=TENANTS).order_by("pk"))


def dispatch_jobs() -> None:
    """A run per tenant, a per-tenant fan-out and a tenant-less run."""
    for client in _tenants():
        dispatch("notes.write_note", {"label": f"direct-{client.name}"}, tenant=client.pk)
    dispatch("notes.note_every_tenant", {"label": "fanout"})
    dispatch("notes.write_note", {"label": "tenantless"})


def dispatch_async_jobs() -> None:
    for client in _tenants():
        dispatch("notes.write_note_async", {"label": f"async-{client.name}"}, tenant=client)


def dispatch_for_deleted_tenant() -> None:
    """A run for a tenant deleted before a worker takes it (its schema stays); prints its id."""
    client = Client(schema_name="tenant_gone", name="gone")
    client.save(verbosity=0)
    dispatch("notes.write_note", {"label": "gone"}, tenant=client.pk)
    tenant_id = client.pk
    client.delete()
    print(tenant_id)
