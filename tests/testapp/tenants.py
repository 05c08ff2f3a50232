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
