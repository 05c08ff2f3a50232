"""The Redis client kumiko_jobs uses, built lazily from settings (never at import time).

Dispatch, workers, ``drain()`` and django-rq's dashboard all use ``get_redis()``: a URL
(``redis://``, ``rediss://``, ``unix://``), a Sentinel URL, or the pool of a django-redis cache
(``"cache:<alias>"``, so a project configures Redis once). See ``redis_target.py``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import redis
from django.core.signals import setting_changed
from django.dispatch import receiver
from redis.sentinel import Sentinel

from kumiko_jobs.conf import get_config
from kumiko_jobs.keys import Keys
from kumiko_jobs.redis_target import RedisTarget, configured_value, parse


def redis_target() -> RedisTarget:
    """The parsed Redis setting (system check kumiko_jobs.E013 reports one that does not parse)."""
    return parse(configured_value(get_config())[1])


def get_redis() -> redis.Redis:
    """Client for dispatch and workers; socket timeouts bound every call (QueueUnavailable)."""
    return _connection()[0]


@cache
def _connection() -> tuple[redis.Redis, bool]:
    """The client, and whether kumiko owns it (a cache's client belongs to the cache)."""
    target = redis_target()
    timeout = float(get_config()["REDIS_TIMEOUT"])
    if target.kind == "cache":
        # The cache's own pool, with the cache's socket options (check kumiko_jobs.W105 asks
        # for timeouts there): a second pool would be a second configuration of Redis.
        from django_redis import get_redis_connection

        client: redis.Redis = get_redis_connection(target.cache_alias, write=True)
        return client, False
    options: dict[str, Any] = {
        "socket_connect_timeout": timeout,
        "socket_timeout": timeout,
        "health_check_interval": 30,
    }
    if target.kind == "sentinel":
        return _sentinel_master(target, options), True
    return redis.Redis.from_url(target.raw, **options), True


def _sentinel_master(target: RedisTarget, options: dict[str, Any]) -> redis.Redis:
    tls: dict[str, Any] = {"ssl": True, **target.ssl_options} if target.ssl else {}
    sentinel_options: dict[str, Any] = {
        "socket_connect_timeout": options["socket_connect_timeout"],
        "socket_timeout": options["socket_timeout"],
        **tls,
    }
    if target.sentinel_password:
        sentinel_options["password"] = target.sentinel_password
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_options, **tls)  # type: ignore[no-untyped-call]
    # The pool asks the sentinels for the current master on every new connection, so a
    # failover is followed without a restart.
    master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.service_name,
        db=target.db,
        username=target.username,
        password=target.password,
        **options,
    )
    return master


@cache
def get_keys() -> Keys:
    return Keys(str(get_config()["QUEUE_PREFIX"]))


def reset() -> None:
    """Forget cached clients (settings changed, or a forked process)."""
    if _connection.cache_info().currsize:
        client, owned = _connection()
        if owned:
            client.close()
    _connection.cache_clear()
    get_keys.cache_clear()


@receiver(setting_changed)
def _reset_on_settings_change(*, setting: str, **kwargs: Any) -> None:
    # CACHES too: KUMIKO_JOBS["REDIS"] may name a django-redis cache.
    if setting in ("KUMIKO_JOBS", "CACHES"):
        reset()
