"""Tenant sources for fan-out tests."""

from __future__ import annotations

from collections.abc import Iterator

from kumiko_jobs.connection import get_keys, get_redis
from project.demo.tenants import active_tenant_ids


def fails_midway_once() -> Iterator[int]:
    """Yields half the tenants, then fails -- only on the first call (a wrapper's first attempt)."""
    first_call = get_redis().incr(f"{get_keys().prefix}:tenant-source-calls") == 1
    ids = list(active_tenant_ids())
    for index, tenant_id in enumerate(ids):
        if first_call and index == len(ids) // 2:
            raise ConnectionError("tenant directory went away mid-listing")
        yield tenant_id


def _zones_key() -> str:
    return f"{get_keys().prefix}:test-zones"


def set_zones(zones: dict[str, str]) -> None:
    """Put tenants (by id) in time zones, for this test's prefix (TENANT_TIMEZONE reads it)."""
    get_redis().hset(_zones_key(), mapping=zones)


def tenant_timezone(tenant_id: object) -> str:
    """TENANT_TIMEZONE of the test settings: the zone set_zones() gave the tenant, else UTC."""
    zone = get_redis().hget(_zones_key(), str(tenant_id))
    if zone == DATABASE_DOWN:
        from django.db import OperationalError

        raise OperationalError("the database system is shutting down")  # what a restart says
    if zone == QUERY_FAILS:
        from django.db import ProgrammingError

        raise ProgrammingError('relation "acme.settings" does not exist')  # this tenant's own
    if zone == QUERY_TIMES_OUT:
        from django.db import connection

        with connection.cursor() as cursor:  # a real query cancelled by statement_timeout (57014)
            cursor.execute("SET statement_timeout = 50")
            try:
                cursor.execute("SELECT pg_sleep(1)")
            finally:
                cursor.execute("SET statement_timeout = 0")
    return zone.decode() if zone is not None else "UTC"


# set_zones({tenant: DATABASE_DOWN.decode()}): tenant_timezone() fails as a database restart would.
DATABASE_DOWN = b"!database-down"
# set_zones({tenant: QUERY_FAILS.decode()}): a query that fails for this tenant only.
QUERY_FAILS = b"!query-fails"
# ... or one whose query PostgreSQL cancels (statement_timeout): an OperationalError, the tenant's.
QUERY_TIMES_OUT = b"!query-times-out"


def many() -> range:
    """Enough tenants that a fan-out batch records its children with COPY (run_rows.COPY_FROM)."""
    return range(1000, 1150)  # 150 children


def instances_and_a_bad_one() -> list[object]:
    """Model instances (their str() is a display name) and an item no tenant id can be."""
    from project.demo.models import Tenant

    return [*Tenant.objects.filter(active=True).order_by("pk"), "x" * 65]
