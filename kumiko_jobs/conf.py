"""Settings: one dict of defaults, read lazily from ``settings.KUMIKO_JOBS``, never written back."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from kumiko_jobs.redis_target import InvalidRedisSetting, configured_value, mask_password, parse

CONFIG_DEFAULTS: dict[str, Any] = {
    # Where Redis is: a URL (redis://, rediss://, unix://, redis+sentinel://) or "cache:<alias>"
    # (the pool of a django-redis cache); see redis_target.py. None: REDIS_URL, then env
    # KUMIKO_REDIS_URL, then redis://127.0.0.1:6379/0.
    "REDIS": None,
    # The older name of REDIS, for URLs only; setting both is an error (kumiko_jobs.E102).
    "REDIS_URL": None,
    "QUEUE_PREFIX": "kumiko",
    # Dotted path to () -> iterable of tenant ids; needed by per_tenant jobs.
    "ACTIVE_TENANTS": None,
    # Dotted path to (user) -> tenant id | None.
    "USER_TENANT": None,
    # Dotted path to (tenant_id) -> context manager entered around every handler.
    "TENANT_ACTIVATOR": "kumiko_jobs.tenancy.scopes_activator",
    # "app_label.Model" of the tenant model; when set, dispatch() checks that a tenant id exists.
    "TENANT_MODEL": None,
    "JOB_MODULE": "jobs",
    # Module of Django @task functions imported in every installed app at start-up when TASKS
    # uses KumikoTaskBackend (so the admin lists them); None: tasks are found on first use.
    "TASK_MODULE": "tasks",
    # Seconds a dispatch waits for Redis before raising QueueUnavailable.
    "REDIS_TIMEOUT": 5.0,
    # Seconds Redis keeps a succeeded job's hash. 0: none (the JobRun table is the history, and a
    # day of hashes at 1,000 jobs/s would be tens of GB of Redis memory); set it to see finished
    # jobs in RQ's dashboard. Failed jobs are kept for FAILURE_TTL.
    "RESULT_TTL": 0,
    "FAILURE_TTL": 7 * 24 * 3600,
    # A worker whose running job has not heartbeaten for this long is considered dead.
    "ABANDON_AFTER": 20,
    "HEARTBEAT_INTERVAL": 5,
    # Extra attempts granted only to runs abandoned by a dead worker (so a deploy's SIGKILL
    # does not turn a retry-less job into a final failure).
    "ABANDONED_RETRIES": 1,
    # Unknown job names found in a queue (rolling deploys) are retried this long before failing.
    "UNKNOWN_JOB_GRACE": 600,
    "UNKNOWN_JOB_RETRY_DELAY": 15,
    # Seconds a positive tenant-existence lookup is cached per process.
    "TENANT_CACHE_SECONDS": 60,
    # Seconds a run must last before its record shows "running" (shorter runs go straight from
    # queued to their outcome, saving a commit per job; their start time is still recorded).
    "RUNNING_MARK_DELAY": 0.2,
    # Escape-hatch audit window in seconds: one audit row per (job, tenant, kind) per window.
    "AUDIT_WINDOW": 60,
    # Seconds past its timeout a handler in a job thread (runjobs --threads N) may stay blocked in
    # C code before the worker gives up its lease and recycles the process (timeouts.py).
    "STUCK_AFTER": 5.0,
    # PostgreSQL with psycopg 3: a dispatch's INSERT and a worker's outcome UPDATE go through
    # libpq's pipeline, prepared (pg_pipeline.py). False sends them through a cursor, where tools
    # that patch Django's cursor class (Sentry, APM agents) see them; about 1.5x slower dispatch.
    "PIPELINED_WRITES": True,
    # Seconds a worker keeps one database connection before replacing it (CONN_MAX_AGE is for
    # requests; see db_connections.py).
    "WORKER_DB_MAX_AGE": 300,
    # Largest payload dispatch() accepts, as encoded JSON: a job hash lives in Redis memory and
    # its row in the run table, so large data belongs in storage and its id in the payload.
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # Seconds finished runs (and their tenant failure records) and escape-hatch audits are
    # kept; older ones are pruned daily (retention.py). Queued, running and deferred runs never.
    "RUN_RETENTION": 30 * 24 * 3600,
    "AUDIT_RETENTION": 90 * 24 * 3600,
    # Schedules (kumiko_jobs/scheduling). Dotted path to (tenant_id) -> IANA zone name, for
    # cron(..., tz="tenant"); None puts every tenant in UTC.
    "TENANT_TIMEZONE": None,
    # Seconds between rebuilds of the tenant zone index (ACTIVE_TENANTS x TENANT_TIMEZONE).
    "TENANT_ZONE_REFRESH": 300,
    # Ticks missed while no leader ran are fired late if younger than this (seconds), else skipped.
    "CRON_CATCH_UP": 600,
    # Seconds after the last process declaring a schedule stopped before its state is removed.
    "ORPHAN_GRACE": 600,
    # run_on_boot jobs are dispatched once per Redis dataset, QUEUE_PREFIX and RELEASE.
    "RELEASE": "",
    # A boot gate without a timeout that runs longer than this (seconds) logs a warning.
    "BOOT_GATE_WARN_AFTER": 60,
    # Optional list of the event names emit() may fire; None accepts any name.
    "EVENTS": None,
    # Dotted path to (text) -> text applied to error text, tracebacks and ctx.log lines before
    # they are stored or logged (scrubbing.py); None stores them as they are.
    "SCRUBBER": "kumiko_jobs.scrubbing.scrub_text",
    # Copy ctx.log lines (scrubbed) to the "kumiko_jobs.jobs" logger too; they always land on
    # the run record (up to context.MAX_LOG_LINES an attempt; those over it are copied neither).
    # Off by default: job lines can be many, and the record is their home.
    "LOG_JOB_LINES": False,
}


def redis_url() -> str:
    """The Redis setting in force as written (a URL or "cache:<alias>"); may hold a password."""
    return configured_value(get_config())[1]


def redis_description() -> str:
    """The Redis setting in force for messages: the URL without its password, or the cache."""
    value = redis_url()
    try:
        return parse(value).describe()
    except InvalidRedisSetting:
        return mask_password(value)


@cache
def get_config() -> dict[str, Any]:
    """The effective settings: defaults overlaid with ``settings.KUMIKO_JOBS``."""
    user = getattr(settings, "KUMIKO_JOBS", {}) or {}
    return {**CONFIG_DEFAULTS, **user}


def import_setting(key: str) -> Any:
    """The callable a hook setting names: a dotted path, or the callable itself; None if unset."""
    value = get_config()[key]
    if value is None or value == "":
        return None
    return import_string(value) if isinstance(value, str) else value


@receiver(setting_changed)
def _reset_config(*, setting: str, **kwargs: Any) -> None:
    # Modules that cache something derived from these settings listen for the same signal;
    # receivers run in connection order, and this one is connected first (conf is imported
    # by every one of them).
    if setting == "KUMIKO_JOBS":
        get_config.cache_clear()
