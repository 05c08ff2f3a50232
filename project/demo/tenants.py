"""Tenant hooks named in KUMIKO_JOBS (ACTIVE_TENANTS, USER_TENANT)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from project.demo.models import Tenant


def active_tenant_ids() -> Iterator[int]:
    # iterator(): fan-out to many tenants never holds the whole list in memory.
    return (
        Tenant.objects.filter(active=True)
        .order_by("pk")
        .values_list("pk", flat=True)
        .iterator(chunk_size=1000)
    )


def tenant_of_user(user: Any) -> int | None:
    """The tenant a user acts for (its first membership); None for everyone else."""
    if not getattr(user, "is_authenticated", False):
        return None
    return Tenant.objects.filter(members=user).order_by("pk").values_list("pk", flat=True).first()
