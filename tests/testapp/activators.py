"""A TENANT_ACTIVATOR of a project's own that does not set kumiko's current-tenant variable."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def schema_only(tenant_id: str | None) -> Iterator[None]:
    yield


# What slow_recorded did, in order: ("enter", tenant) and ("exit", tenant).
RECORDED: list[tuple[str, str | None]] = []


@contextmanager
def slow_recorded(tenant_id: str | None) -> Iterator[None]:
    """Takes its time to enter (a schema switch on a busy database), and records both ends."""
    import time

    time.sleep(0.3)
    RECORDED.append(("enter", tenant_id))
    try:
        yield
    finally:
        RECORDED.append(("exit", tenant_id))
