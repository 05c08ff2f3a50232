"""A TENANT_ACTIVATOR of a project's own that does not set kumiko's current-tenant variable."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def schema_only(tenant_id: str | None) -> Iterator[None]:
    yield
