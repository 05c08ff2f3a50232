"""The Redis client kumiko_jobs uses, built lazily from settings (never at import time)."""

from __future__ import annotations

from functools import cache
from typing import Any

import redis
from django.core.signals import setting_changed
from django.dispatch import receiver

from kumiko_jobs.conf import get_config, redis_url
from kumiko_jobs.keys import Keys


@cache
def get_redis() -> redis.Redis:
    """Client for dispatch and workers; socket timeouts bound every call (QueueUnavailable)."""
    timeout = float(get_config()["REDIS_TIMEOUT"])
    return redis.Redis.from_url(
        redis_url(), socket_connect_timeout=timeout, socket_timeout=timeout, health_check_interval=30
    )


@cache
def get_keys() -> Keys:
    return Keys(str(get_config()["QUEUE_PREFIX"]))


def reset() -> None:
    """Forget cached clients (settings changed, or a forked process)."""
    if get_redis.cache_info().currsize:
        get_redis().close()
    get_redis.cache_clear()
    get_keys.cache_clear()


@receiver(setting_changed)
def _reset_on_settings_change(*, setting: str, **kwargs: Any) -> None:
    if setting == "KUMIKO_JOBS":
        reset()
