"""Checks of ``settings.KUMIKO_JOBS``: every key a worker or dispatch reads is validated here,
so a bad value fails ``manage.py check`` instead of a running worker."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.apps import AppConfig, apps
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning
from django.utils.module_loading import import_string

from kumiko_jobs.checks.schedules import SETTING_RULES as SCHEDULE_RULES
from kumiko_jobs.checks.values import is_int_at_least, is_number_above, is_positive_int
from kumiko_jobs.conf import CONFIG_DEFAULTS, get_config

_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
HOOKS = ("ACTIVE_TENANTS", "USER_TENANT", "TENANT_ACTIVATOR", "TENANT_TIMEZONE")
POSITIVE_NUMBERS = (
    "REDIS_TIMEOUT",
    "FAILURE_TTL",
    "ABANDON_AFTER",
    "HEARTBEAT_INTERVAL",
    "UNKNOWN_JOB_GRACE",
    "UNKNOWN_JOB_RETRY_DELAY",
    "TENANT_CACHE_SECONDS",
    "WORKER_DB_MAX_AGE",
    "CRON_CATCH_UP",
    "ORPHAN_GRACE",
    "TENANT_ZONE_REFRESH",
    "BOOT_GATE_WARN_AFTER",
    "STUCK_AFTER",
)
MIN_RETENTION = 3600
Problem = tuple[str, str, str]  # message, hint, id suffix
SCRUBBER_PROBE = "ValueError: could not reach https://user:secret@example.com for ann@example.com"


@register(Tags.compatibility, "kumiko_jobs")
def check_settings(app_configs: Iterable[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    config = get_config()
    out: list[CheckMessage] = [
        CheckWarning(
            f"KUMIKO_JOBS[{key!r}] is not a known setting and is ignored.",
            hint=f"Known settings: {', '.join(sorted(CONFIG_DEFAULTS))}.",
            id="kumiko_jobs.W001",
        )
        for key in sorted(set(config) - set(CONFIG_DEFAULTS))
    ]
    out += [
        Error(message, hint=hint, id=f"kumiko_jobs.{code}")
        for rule in _RULES
        for message, hint, code in rule(config)
    ]
    return out


def _queue_prefix(config: dict[str, Any]) -> Iterator[Problem]:
    prefix = config["QUEUE_PREFIX"]
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        yield (
            f"KUMIKO_JOBS['QUEUE_PREFIX'] {prefix!r} is invalid.",
            "Use 1-64 characters of letters, digits and _ . : -",
            "E018",
        )


def _hooks(config: dict[str, Any]) -> Iterator[Problem]:
    for key in HOOKS:
        value = config.get(key)
        if value is None or value == "":
            continue  # unset, as conf.import_setting reads it
        _target, problem = _callable_named(value)
        if problem:
            yield (
                f"KUMIKO_JOBS[{key!r}] = {value!r} cannot be used: {problem}.",
                "Give the dotted path of a callable, e.g. 'myapp.tenants.active_tenant_ids'.",
                "E019",
            )


def _callable_named(value: Any) -> tuple[Any, str]:
    """(the callable a hook setting names, "") or (None, why it cannot be used): the check's side
    of conf.import_setting, which raises instead."""
    try:
        target = import_string(value) if isinstance(value, str) else value
    except Exception as exc:  # a module that raises on import: reported, not a crashed check
        return None, f"{type(exc).__name__}: {exc}"
    return (target, "") if callable(target) else (None, "it is not callable")


def _tenant_model(config: dict[str, Any]) -> Iterator[Problem]:
    model = config.get("TENANT_MODEL")
    if model is None:
        return
    try:
        apps.get_model(model)
    except (LookupError, ValueError, TypeError, AttributeError) as exc:
        yield (
            f"KUMIKO_JOBS['TENANT_MODEL'] = {model!r} is not an installed model ({exc}).",
            "Use 'app_label.ModelName' of your tenant model, or remove the setting.",
            "E020",
        )


def _positive_numbers(config: dict[str, Any]) -> Iterator[Problem]:
    for key in POSITIVE_NUMBERS:
        if not is_number_above(config[key], 0):
            yield (
                f"KUMIKO_JOBS[{key!r}] = {config[key]!r} must be a positive number.",
                f"The default is {CONFIG_DEFAULTS[key]!r}.",
                "E021",
            )


def _result_ttl(config: dict[str, Any]) -> Iterator[Problem]:
    if not is_int_at_least(config["RESULT_TTL"], 0):
        yield (
            f"KUMIKO_JOBS['RESULT_TTL'] = {config['RESULT_TTL']!r} must be a whole number of seconds >= 0.",
            "0 (the default) deletes a succeeded job from Redis at once; its run record stays.",
            "E033",
        )


def _running_mark_delay(config: dict[str, Any]) -> Iterator[Problem]:
    delay = config["RUNNING_MARK_DELAY"]
    if not is_number_above(delay, 0, inclusive=True):
        yield (
            f"KUMIKO_JOBS['RUNNING_MARK_DELAY'] = {delay!r} must be a number of seconds >= 0.",
            "0 marks every run running at once; the default 0.2 skips that write for short runs.",
            "E027",
        )


def _lease(config: dict[str, Any]) -> Iterator[Problem]:
    interval, lease = config["HEARTBEAT_INTERVAL"], config["ABANDON_AFTER"]
    if is_number_above(interval, 0) and is_number_above(lease, 0) and interval * 2 > lease:
        yield (
            "KUMIKO_JOBS['ABANDON_AFTER'] must be at least twice HEARTBEAT_INTERVAL.",
            "Otherwise a live but briefly slow worker is declared dead.",
            "E028",
        )


def _audit_window(config: dict[str, Any]) -> Iterator[Problem]:
    if not is_positive_int(config["AUDIT_WINDOW"]):
        yield (
            f"KUMIKO_JOBS['AUDIT_WINDOW'] = {config['AUDIT_WINDOW']!r} must be whole seconds >= 1.",
            "One escape-hatch audit row is written per job, tenant and kind per window; the default is 60.",
            "E029",
        )


def _abandoned_retries(config: dict[str, Any]) -> Iterator[Problem]:
    if not is_int_at_least(config["ABANDONED_RETRIES"], 0):
        yield (
            f"KUMIKO_JOBS['ABANDONED_RETRIES'] = {config['ABANDONED_RETRIES']!r} must be an integer >= 0.",
            "Extra attempts granted to runs whose worker died; the default is 1, 0 disables them.",
            "E030",
        )


def _max_payload_bytes(config: dict[str, Any]) -> Iterator[Problem]:
    if not is_positive_int(config["MAX_PAYLOAD_BYTES"]):
        yield (
            f"KUMIKO_JOBS['MAX_PAYLOAD_BYTES'] = {config['MAX_PAYLOAD_BYTES']!r} must be a positive integer.",
            "The largest encoded payload dispatch() accepts; the default is 1048576 (1 MiB).",
            "E032",
        )


def _retention(config: dict[str, Any]) -> Iterator[Problem]:
    for key in ("RUN_RETENTION", "AUDIT_RETENTION"):
        if not is_int_at_least(config[key], MIN_RETENTION):
            yield (
                f"KUMIKO_JOBS[{key!r}] = {config[key]!r} must be whole seconds, "
                f"at least {MIN_RETENTION} (an hour).",
                f"How long history is kept before the daily prune deletes it; the default is "
                f"{CONFIG_DEFAULTS[key]} ({CONFIG_DEFAULTS[key] // 86400} days).",
                "E305",
            )


def _job_module(config: dict[str, Any]) -> Iterator[Problem]:
    module = config["JOB_MODULE"]
    if not isinstance(module, str) or not _MODULE_RE.match(module):
        yield (
            f"KUMIKO_JOBS['JOB_MODULE'] = {module!r} is not a module name.",
            "The module autodiscovered in every installed app, e.g. 'jobs' (the default) or 'tasks.jobs'.",
            "E031",
        )


def _scrubber(config: dict[str, Any]) -> Iterator[Problem]:
    value = config["SCRUBBER"]
    if value is None or value == "":
        return  # no scrubber, as conf.import_setting reads it
    scrubber, problem = _callable_named(value)
    if problem:
        yield (
            f"KUMIKO_JOBS['SCRUBBER'] = {value!r} cannot be used: {problem}.",
            "Give the dotted path of a (text) -> text function, e.g. the default "
            "'kumiko_jobs.scrubbing.scrub_text', or None to store error text as it is.",
            "E401",
        )
        return
    try:
        result = scrubber(SCRUBBER_PROBE)
    except Exception as exc:
        result = exc
    if not isinstance(result, str):
        yield (
            f"KUMIKO_JOBS['SCRUBBER'] = {value!r} does not turn text into text: given a sample error "
            f"message it {'raised' if isinstance(result, Exception) else 'returned'} {result!r:.80}.",
            "The scrubber gets one str and must return a str (the scrubbed text).",
            "E402",
        )


# Settings that are True or False: (key, hint, check id).
_BOOLEANS = (
    (
        "LOG_JOB_LINES",
        "True copies ctx.log lines (scrubbed) to the 'kumiko_jobs.jobs' logger; the default False "
        "keeps them on the run record only.",
        "E403",
    ),
    (
        "PIPELINED_WRITES",
        "True (the default) sends the run-record writes of dispatch() and the workers through "
        "libpq's pipeline on PostgreSQL; False sends them through a cursor, for tools that patch it.",
        "E035",
    ),
)


def _booleans(config: dict[str, Any]) -> Iterator[Problem]:
    for key, hint, code in _BOOLEANS:
        if not isinstance(config[key], bool):
            yield (f"KUMIKO_JOBS[{key!r}] = {config[key]!r} must be True or False.", hint, code)


def _task_module(config: dict[str, Any]) -> Iterator[Problem]:
    module = config["TASK_MODULE"]
    if module is not None and (not isinstance(module, str) or not _MODULE_RE.match(module)):
        yield (
            f"KUMIKO_JOBS['TASK_MODULE'] = {module!r} is not a module name or None.",
            "The module of Django @task functions imported at start-up when TASKS uses "
            "KumikoTaskBackend, e.g. 'tasks' (the default); None imports none.",
            "E506",
        )


def _tenant_schemas(config: dict[str, Any]) -> Iterator[Problem]:
    from django.conf import settings

    tenant_apps = getattr(settings, "TENANT_APPS", None)  # django-tenants' per-schema apps
    if isinstance(tenant_apps, list | tuple) and "kumiko_jobs" in tenant_apps:
        yield (
            "kumiko_jobs is in TENANT_APPS: its run records would be created in every tenant's "
            "schema, while workers and the console read one set of them.",
            "List kumiko_jobs in SHARED_APPS only (its tables live in the public schema); "
            "TENANT_ACTIVATOR = 'kumiko_jobs.tenancy_schemas.schema_activator' runs each handler "
            "in its tenant's schema.",
            "E034",
        )


_RULES: tuple[Callable[[dict[str, Any]], Iterator[Problem]], ...] = (
    _queue_prefix,
    _hooks,
    _tenant_model,
    _positive_numbers,
    _result_ttl,
    _running_mark_delay,
    _lease,
    _audit_window,
    _abandoned_retries,
    _max_payload_bytes,
    _job_module,
    _retention,
    *SCHEDULE_RULES,
    _scrubber,
    _booleans,
    _task_module,
    _tenant_schemas,
)
