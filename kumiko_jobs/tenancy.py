"""Tenants: how dispatch() names them and how a worker activates one around a handler."""

from __future__ import annotations

import contextvars
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from functools import cache
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.signals import setting_changed
from django.db import models
from django.dispatch import receiver

from kumiko_jobs.conf import get_config, import_setting
from kumiko_jobs.exceptions import InvalidTenant

_current_tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("kumiko_tenant", default=None)
_known_tenants: dict[str, float] = {}

logger = logging.getLogger("kumiko_jobs")
Activator = Callable[[str | None], AbstractContextManager[Any]]


def current_tenant_id() -> str | None:
    """The tenant of the run being executed in this context (None outside jobs / tenant-less)."""
    return _current_tenant.get()


@contextmanager
def tenant_context(tenant_id: str | int | None) -> Iterator[None]:
    """Make ``tenant_id`` the current tenant inside the block (a context variable, so sync and
    async code see it). Django tasks enqueued inside run for it: use it in a request
    middleware, ``with tenant_context(request.tenant.pk): return get_response(request)``.
    Workers set it around every handler (the activator)."""
    # A model instance counts as its key (its str() is a display name, which no tenant has).
    key = getattr(tenant_id, "pk", tenant_id)
    token = _current_tenant.set(None if key is None else str(key))
    try:
        yield
    finally:
        _current_tenant.reset(token)


@contextmanager
def scopes_activator(tenant_id: str | None) -> Iterator[None]:
    """Default activator: the context variable, plus django-scopes' ``scope(tenant=…)`` if installed."""
    # The context variable directly, not through tenant_context() and an ExitStack: this is
    # on every attempt's path (~4 % of a trivial job's time with 8 threads).
    token = _current_tenant.set(None if tenant_id is None else str(tenant_id))
    try:
        scope = _django_scopes_scope()
        if scope is None:
            yield
        elif tenant_id is None:
            with _no_tenant_scope():
                yield
        else:
            # Scoped managers filter FKs by this value; an id works without loading the tenant.
            with scope(tenant=tenant_id):
                yield
    finally:
        _current_tenant.reset(token)


@contextmanager
def _no_tenant_scope() -> Iterator[None]:
    """A run without a tenant (a system run): a scope with no tenant in it, so a scoped model
    raises django-scopes' ScopeError until the job leaves the scope through an audited escape
    hatch (``ctx.unscoped()``, ``ctx.cross_tenant_reads()``). ``scope(tenant=None)`` would
    filter nothing: every tenant's rows, with no grant and no audit. django-scopes has no public
    call for "this dimension is not set", so its state variable is set directly."""
    from django_scopes.state import state

    token = state.set({"_enabled": True})
    try:
        yield
    finally:
        state.reset(token)


@cache
def _django_scopes_scope() -> Callable[..., AbstractContextManager[Any]] | None:
    try:
        from django_scopes import scope
    except ImportError:
        return None
    return scope  # type: ignore[no-any-return]


def activation(tenant_id: str | None) -> AbstractContextManager[Any]:
    """The run's tenant activated around its handler: ``TENANT_ACTIVATOR``, and the
    current-tenant variable, which a project's activator need not set (Django tasks enqueued in
    the run and an async handler's database thread read it). kumiko's own activators set it
    already: not twice on every attempt."""
    activator = get_activator()
    if activator is scopes_activator or activator is tenant_context:
        return activator(tenant_id)
    stack = ExitStack()
    stack.enter_context(tenant_context(tenant_id))
    try:
        stack.enter_context(activator(tenant_id))
    except BaseException:
        stack.close()
        raise
    return stack


@cache
def get_activator() -> Activator:
    """``TENANT_ACTIVATOR``; unset (None or ""), the current-tenant variable alone: every attempt
    called None and failed with a TypeError, which ``manage.py check`` did not foresee."""
    activator: Activator | None = import_setting("TENANT_ACTIVATOR")
    return activator if activator is not None else tenant_context


def active_tenant_ids() -> Iterator[Any]:
    """The tenants a per_tenant job fans out to (``KUMIKO_JOBS["ACTIVE_TENANTS"]``)."""
    source = import_setting("ACTIVE_TENANTS")
    if source is None:
        raise ImproperlyConfigured(
            "per_tenant jobs need KUMIKO_JOBS['ACTIVE_TENANTS']: the dotted path of a function "
            "returning the active tenant ids."
        )
    return _explaining_lost_cursors(source(), get_config()["ACTIVE_TENANTS"])


# SQLSTATE invalid_cursor_name: a FETCH named a cursor this server connection does not have.
_INVALID_CURSOR_NAME = "34000"


def _explaining_lost_cursors(tenants: Iterable[Any], source: object) -> Iterator[Any]:
    """``tenants``, with the one failure a pooler causes explained. A queryset's ``.iterator()``
    on PostgreSQL reads through a server-side cursor, one FETCH at a time; outside a transaction,
    a pooler in transaction mode (PgBouncer) may send the next FETCH to another server connection,
    where the cursor does not exist. The fan-out reads tenants between its own writes, so it
    cannot hold one transaction around them: the cure is Django's setting."""
    try:
        yield from tenants
    except Exception as exc:
        # The driver's error as it is (Django does not wrap a chunked fetch's), or wrapped.
        if _INVALID_CURSOR_NAME not in (_sqlstate(exc), _sqlstate(exc.__cause__)):
            raise
        raise ImproperlyConfigured(
            f"ACTIVE_TENANTS ({source}) reads through a server-side cursor (QuerySet.iterator()) "
            "that was gone at its next fetch: a pooler in transaction mode, such as PgBouncer, "
            "sends each statement outside a transaction to any of its server connections. Set "
            "\"DISABLE_SERVER_SIDE_CURSORS\": True in that database's DATABASES entry (Django's "
            'docs: "Transaction pooling and server-side cursors"), or return a list.'
        ) from exc


def _sqlstate(exc: BaseException | None) -> str | None:
    """A PostgreSQL error's SQLSTATE: psycopg 3's ``sqlstate``, psycopg2's ``pgcode``."""
    return getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)


def tenant_model() -> type[models.Model] | None:
    label = get_config().get("TENANT_MODEL")
    return apps.get_model(label) if label else None


def normalise_tenant(tenant: Any) -> str | None:
    """The tenant id kept in job metadata: one canonical string per tenant.

    With ``TENANT_MODEL`` the id goes through the model's primary key field and back, so ``1``,
    ``"1"``, ``" 1"`` and ``"01"`` all become ``"1"`` (the database treats them as the same
    tenant, so caps, fairness and tenant staff must too), and the tenant must exist.
    """
    if tenant is None:
        return None
    model = tenant_model()
    if isinstance(tenant, models.Model):
        if model is not None and not isinstance(tenant, model):
            raise InvalidTenant(
                f"tenant={tenant!r} is a {type(tenant).__name__}, not a {model.__name__} "
                f"(KUMIKO_JOBS['TENANT_MODEL'] = {model._meta.label!r})."
            )
        if tenant.pk is None:
            raise InvalidTenant(f"Tenant {tenant!r} has no primary key yet; save it before dispatching.")
        tenant = tenant.pk
    value = _tenant_key(tenant, model)
    if model is not None:
        _check_exists(model, value)
    return value


def listed_tenant_id(tenant: Any) -> str | None:
    """A tenant from ``ACTIVE_TENANTS`` as dispatch keeps its id (``normalise_tenant`` without
    the existence query: the source lists existing tenants), so a fan-out's children land under
    the id the tenant's own dispatches, caps and history use. None for an item that cannot be a
    tenant id: it is logged and skipped, so one bad item does not fail every batch after it."""
    try:
        return tenant_key(tenant)
    except InvalidTenant as exc:
        logger.warning("kumiko_jobs: ACTIVE_TENANTS gave %r, which is skipped: %s", tenant, exc)
        return None


def tenant_key(tenant: Any) -> str:
    """A tenant (instance or id) as run records keep its id, without asking the database
    whether it exists; InvalidTenant for what cannot be a tenant id."""
    return _tenant_key(tenant.pk if isinstance(tenant, models.Model) else tenant, tenant_model())


def _tenant_key(tenant: Any, model: type[models.Model] | None) -> str:
    if isinstance(tenant, bool) or not isinstance(tenant, str | int | uuid.UUID):
        raise InvalidTenant(
            f"tenant={tenant!r} must be a tenant model instance or its id (str, int or UUID), "
            f"not {type(tenant).__name__}."
        )
    value = _canonical(tenant, model)
    if not value or len(value) > 64 or not value.isprintable() or value != value.strip():
        raise InvalidTenant(
            f"tenant id {value!r} must be 1-64 printable characters without surrounding spaces."
        )
    return value


def _canonical(tenant: str | int | uuid.UUID, model: type[models.Model] | None) -> str:
    if model is None or model._meta.pk is None:
        return str(tenant)
    try:
        return str(model._meta.pk.to_python(tenant))
    except ValidationError as exc:
        raise InvalidTenant(
            f"tenant id {tenant!r} is not a valid {model.__name__} key: {' '.join(exc.messages)}"
        ) from exc


def _check_exists(model: type[models.Model], tenant_id: str) -> None:
    now = time.monotonic()
    seen = _known_tenants.get(tenant_id)
    if seen is not None and now - seen < float(get_config()["TENANT_CACHE_SECONDS"]):
        return
    try:
        exists = model._default_manager.filter(pk=tenant_id).exists()
    except (ValueError, TypeError) as exc:
        raise InvalidTenant(f"tenant id {tenant_id!r} is not a valid {model.__name__} key: {exc}") from exc
    if not exists:
        raise InvalidTenant(
            f"Tenant {tenant_id!r} does not exist ({model._meta.label}). Pass an existing tenant or its id."
        )
    _known_tenants[tenant_id] = now


def user_id_of(user: Any) -> str | None:
    if user is None:
        return None
    if isinstance(user, models.Model):
        return None if user.pk is None else str(user.pk)
    if getattr(user, "is_anonymous", False):
        return None
    return str(user)


def reset_caches() -> None:
    _known_tenants.clear()
    get_activator.cache_clear()


@receiver(setting_changed)
def _reset_on_settings_change(*, setting: str, **kwargs: Any) -> None:
    if setting == "KUMIKO_JOBS":
        reset_caches()
