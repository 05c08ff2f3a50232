"""What the escape hatches do once ``JobContext`` has checked the grant; each use is audited."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.db import connections

from kumiko_jobs.audit import report_use
from kumiko_jobs.exceptions import EscapeHatchDenied

if TYPE_CHECKING:
    from kumiko_jobs.context import JobContext

_acting_user: contextvars.ContextVar[Any] = contextvars.ContextVar("kumiko_acting_user", default=None)
_WRITE_VERBS = ("insert", "update", "delete", "replace", "merge", "create", "drop", "alter", "truncate")


def acting_user() -> Any:
    """The identity a job switched to with ``ctx.as_user()``, or None."""
    return _acting_user.get()


@contextmanager
def _scopes_disabled() -> Iterator[None]:
    try:
        from django_scopes import scopes_disabled
    except ImportError:
        yield
        return
    with scopes_disabled():
        yield


@contextmanager
def unscoped(ctx: JobContext) -> Iterator[None]:
    report_use(ctx, "unscoped")
    with _scopes_disabled():
        yield


def _refuse_writes(job_name: str) -> Callable[..., Any]:
    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip().split(None, 1)[0].lower() in _WRITE_VERBS:
            raise EscapeHatchDenied(
                f"Job {job_name!r} tried to write inside ctx.cross_tenant_reads(); it allows reads only. "
                "Write after leaving the block, or declare the unscoped grant and use ctx.unscoped()."
            )
        return execute(sql, params, many, context)

    return wrapper


@contextmanager
def cross_tenant_reads(ctx: JobContext) -> Iterator[None]:
    report_use(ctx, "cross_tenant_reads")
    with _scopes_disabled(), connections["default"].execute_wrapper(_refuse_writes(ctx.job_name)):
        yield


@contextmanager
def as_user(ctx: JobContext, user: Any) -> Iterator[None]:
    report_use(ctx, "as_user")
    token = _acting_user.set(user)
    try:
        yield
    finally:
        _acting_user.reset(token)
