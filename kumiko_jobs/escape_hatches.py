"""What the escape hatches do once ``JobContext`` has checked the grant; each use is audited."""

from __future__ import annotations

import asyncio
import contextvars
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any

from django.db import connections

from kumiko_jobs.audit import report_use
from kumiko_jobs.exceptions import EscapeHatchDenied

if TYPE_CHECKING:
    from kumiko_jobs.context import JobContext

_acting_user: contextvars.ContextVar[Any] = contextvars.ContextVar("kumiko_acting_user", default=None)
_WRITE_VERBS = frozenset(
    ("insert", "update", "delete", "replace", "merge", "create", "drop", "alter", "truncate", "copy", "call")
)
# Leading comments (Django's SQL commenter, OpenTelemetry's) before a statement's verb.
_LEADING_COMMENTS = re.compile(r"^\s*(?:(?:/\*.*?\*/|--[^\n]*\n)\s*)*", re.DOTALL)
# A data-modifying statement inside a WITH query.
_WRITE_IN_WITH = re.compile(r"\b(?:insert|update|delete|merge)\b", re.IGNORECASE)


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
def unscoped(ctx: JobContext, *, writes: bool) -> Iterator[None]:
    """``writes``: the job holds the ``global_writes`` grant; without it the block reads only."""
    if writes:
        report_use(ctx, "unscoped")
        with _scopes_disabled():
            yield
        return
    message = (
        f"Job {ctx.job_name!r} tried to write inside ctx.unscoped() without the global_writes "
        'grant. Declare it: EscapeHatch("<why>", grants=("unscoped", "global_writes")).'
    )
    with _reads_only(ctx, "ctx.unscoped() without global_writes", message):
        report_use(ctx, "unscoped")
        with _scopes_disabled():
            yield


def is_write(sql: str) -> bool:
    """Whether a statement writes: by its verb, after leading comments; a WITH query by the
    data-modifying statement in it."""
    text = _LEADING_COMMENTS.sub("", sql, count=1)
    verb = text.split(None, 1)[0].lower() if text.strip() else ""
    if verb == "with":
        return _WRITE_IN_WITH.search(text) is not None
    return verb in _WRITE_VERBS


def _refuse_writes(message: str) -> Callable[..., Any]:
    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if is_write(sql):
            raise EscapeHatchDenied(message)
        return execute(sql, params, many, context)

    return wrapper


@contextmanager
def _reads_only(ctx: JobContext, hatch: str, message: str) -> Iterator[None]:
    """Refuse writes through every database alias of this thread for the block. A wrapper is
    per thread and connection: in an ``async def`` handler the ORM runs on the job's database
    thread, which this thread's wrappers do not reach, so there the hatch must be entered in
    the synchronous code that queries (``sync_to_async``)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise EscapeHatchDenied(
            f"Job {ctx.job_name!r}: {hatch} cannot refuse writes on an event loop (the ORM calls "
            "of an async def handler run on another thread). Enter it inside the synchronous "
            "function that queries, called with sync_to_async."
        )
    with ExitStack() as stack:
        for alias in connections:
            stack.enter_context(connections[alias].execute_wrapper(_refuse_writes(message)))
        yield


@contextmanager
def cross_tenant_reads(ctx: JobContext) -> Iterator[None]:
    message = (
        f"Job {ctx.job_name!r} tried to write inside ctx.cross_tenant_reads(); it allows reads only. "
        "Write after leaving the block, or declare the unscoped and global_writes grants and use "
        "ctx.unscoped()."
    )
    with _reads_only(ctx, "ctx.cross_tenant_reads()", message):
        report_use(ctx, "cross_tenant_reads")
        with _scopes_disabled():
            yield


@contextmanager
def as_user(ctx: JobContext, user: Any) -> Iterator[None]:
    report_use(ctx, "as_user", acting_as=str(getattr(user, "pk", user)))
    token = _acting_user.set(user)
    try:
        yield
    finally:
        _acting_user.reset(token)
