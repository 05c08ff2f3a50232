"""System checks of the Redis setting (``kumiko_jobs.E013`` as before, ``E102``-``E104``, ``W105``,
``E106``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning

from kumiko_jobs.conf import get_config
from kumiko_jobs.redis_target import InvalidRedisSetting, configured_value, parse

DJANGO_REDIS_BACKENDS = ("django_redis.cache.RedisCache",)
_FORMS = (
    "redis://host:6379/0, rediss://host:6380/0, unix:///run/redis.sock, "
    "redis+sentinel://host:26379/mymaster or 'cache:default'"
)


@register(Tags.compatibility, "kumiko_jobs")
def check_redis_setting(app_configs: Iterable[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    config = get_config()
    if config.get("REDIS") and config.get("REDIS_URL"):
        return [
            Error(
                "KUMIKO_JOBS sets both 'REDIS' and 'REDIS_URL'; only REDIS is used.",
                hint="Keep one of them: REDIS takes a URL or 'cache:<alias>', REDIS_URL only a URL.",
                id="kumiko_jobs.E102",
            )
        ]
    name, value = configured_value(config)
    where = name if name.startswith("env") else f"KUMIKO_JOBS[{name!r}]"
    try:
        target = parse(value)
    except InvalidRedisSetting as exc:
        return [Error(f"{where}: {exc}", hint=f"Examples: {_FORMS}.", id="kumiko_jobs.E013")]
    if target.kind != "cache":
        return []
    return _check_cache(where, target.cache_alias)


def _check_cache(where: str, alias: str) -> list[CheckMessage]:
    caches: dict[str, dict[str, Any]] = getattr(settings, "CACHES", {}) or {}
    if alias not in caches:
        return [
            Error(
                f"{where} names the cache {alias!r}, which CACHES does not define.",
                hint=f"Define CACHES[{alias!r}] with django-redis, or set a Redis URL instead.",
                id="kumiko_jobs.E103",
            )
        ]
    backend = caches[alias].get("BACKEND", "")
    if backend not in DJANGO_REDIS_BACKENDS:
        return [
            Error(
                f"{where}: CACHES[{alias!r}] uses {backend!r}; kumiko_jobs can share only a "
                "django-redis cache's connection pool.",
                hint="Use BACKEND 'django_redis.cache.RedisCache' (pip install django-redis), or set "
                "KUMIKO_JOBS['REDIS'] to the Redis URL of that cache.",
                id="kumiko_jobs.E104",
            )
        ]
    try:
        from django_redis import get_redis_connection
    except ImportError:
        return [
            Error(
                f"{where}: CACHES[{alias!r}] uses django-redis, which is not installed.",
                hint="pip install django-redis (or kumiko-jobs[cache]).",
                id="kumiko_jobs.E104",
            )
        ]
    # Builds the client and its pool (no connection is opened) to read the socket options. A
    # cache django-redis cannot build (a LOCATION that is no Redis URL, a CLIENT_CLASS that does
    # not import, a client without one pool) is this check's error, not a crash of every
    # manage.py command that runs the checks.
    try:
        pool_options = get_redis_connection(alias, write=True).connection_pool.connection_kwargs
    except Exception as exc:
        return [
            Error(
                f"{where}: django-redis cannot build the client of CACHES[{alias!r}] "
                f"({exc.__class__.__name__}: {exc}).",
                hint=f"Fix CACHES[{alias!r}] (LOCATION a redis:// URL, OPTIONS' CLIENT_CLASS "
                "django_redis.client.DefaultClient), or set KUMIKO_JOBS['REDIS'] to a Redis URL.",
                id="kumiko_jobs.E106",
            )
        ]
    if pool_options.get("socket_timeout") is None or pool_options.get("socket_connect_timeout") is None:
        return [
            CheckWarning(
                f"{where}: CACHES[{alias!r}] sets no socket timeouts, so a dispatch waits forever for "
                "a Redis that hangs (REDIS_TIMEOUT cannot apply to a shared pool).",
                hint=f'Add "SOCKET_CONNECT_TIMEOUT": 5, "SOCKET_TIMEOUT": 5 to CACHES[{alias!r}]["OPTIONS"].',
                id="kumiko_jobs.W105",
            )
        ]
    return []
