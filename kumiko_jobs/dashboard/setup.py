"""What django-rq needs to show the lanes, supplied by the app so that a project sets nothing.

django-rq reads ``settings.RQ_QUEUES`` (the queues it lists, each with its Redis connection)
and ``settings.RQ["QUEUE_CLASS"]`` (the class it builds them with) on every request and in
``rqstats``. At start-up and whenever ``KUMIKO_JOBS``, ``RQ_QUEUES``, ``RQ`` or ``CACHES``
change, this module adds one ``RQ_QUEUES`` entry per lane (``<prefix>:api``,
``<prefix>:worker``) pointing at kumiko's Redis with the JSON serializer, and sets
``RQ["QUEUE_CLASS"]`` to ``LaneQueue`` unless the project chose its own class. The project's
other queues are left as they are. This is the one place kumiko writes Django settings: these
two belong to django-rq, which has no other way in.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

from kumiko_jobs.connection import get_keys, redis_target
from kumiko_jobs.definitions import LANES
from kumiko_jobs.redis_target import InvalidRedisSetting, RedisTarget

LANE_QUEUE_CLASS = "kumiko_jobs.dashboard.queue.LaneQueue"
# Marks the RQ_QUEUES entries this module wrote (django-rq ignores unknown keys).
MARK = "KUMIKO_JOBS_LANE"

# Lane entries the project defined itself, replaced by ours (check kumiko_jobs.W113 names them).
replaced_entries: set[str] = set()


def rq_connection_config(target: RedisTarget) -> dict[str, Any]:
    """django-rq's connection keys for kumiko's Redis (its own format, see its README)."""
    if target.kind == "cache":
        return {"USE_REDIS_CACHE": target.cache_alias}
    if target.kind == "url":
        return {"URL": target.raw}
    tls: dict[str, Any] = {"ssl": True, **target.ssl_options} if target.ssl else {}
    sentinel_options: dict[str, Any] = dict(tls)
    if target.sentinel_password:
        sentinel_options["password"] = target.sentinel_password
    return {
        "SENTINELS": list(target.sentinels),
        "MASTER_NAME": target.service_name,
        "DB": target.db,
        "USERNAME": target.username,
        "PASSWORD": target.password,
        "SENTINEL_KWARGS": sentinel_options,
        "CONNECTION_KWARGS": tls,
    }


def supply_rq_settings() -> None:
    """Write the lanes into ``RQ_QUEUES`` and the queue class into ``RQ`` (see the module doc)."""
    queues: dict[str, Any] = {
        name: config
        for name, config in (getattr(settings, "RQ_QUEUES", None) or {}).items()
        if not (isinstance(config, dict) and config.get(MARK))
    }
    try:
        connection = rq_connection_config(redis_target())
    except InvalidRedisSetting:
        connection = None  # system check kumiko_jobs.E013 says what is wrong
    replaced_entries.clear()
    if connection is not None:
        for lane in LANES:
            name = get_keys().queue_name(lane)
            if name in queues:
                replaced_entries.add(name)
            queues[name] = {**connection, "SERIALIZER": "rq.serializers.JSONSerializer", MARK: lane}
    settings.RQ_QUEUES = queues
    rq = dict(getattr(settings, "RQ", None) or {})
    if "QUEUE_CLASS" not in rq:
        rq["QUEUE_CLASS"] = LANE_QUEUE_CLASS
        settings.RQ = rq


def _resupply(*, setting: str, **kwargs: Any) -> None:
    if setting in ("KUMIKO_JOBS", "RQ_QUEUES", "RQ", "CACHES"):
        supply_rq_settings()


def install() -> None:
    """Called from ``AppConfig.ready()``."""
    supply_rq_settings()
    setting_changed.connect(_resupply, dispatch_uid="kumiko_jobs.dashboard.setup")
