"""The job registry and the ``@job`` decorator that fills it.

As with ``admin.register`` -> ``site.register``, the decorator only builds a ``JobDefinition``
and hands it to the registry. It normalises unambiguous shorthands (``backoff="fixed"``,
``max_per_tenant=3``) but rejects nothing except unknown option names: the system checks report
bad values, all of them in one ``manage.py check``.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, overload

from kumiko_jobs.definitions import (
    Backoff,
    EscapeHatch,
    EventTrigger,
    Handler,
    JobDefinition,
    ManualTrigger,
    MaxPerTenant,
)
from kumiko_jobs.exceptions import UnknownJob


class JobRegistry:
    """Every ``@job`` of every installed app, looked up by name or event."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobDefinition] = {}
        self._by_event: dict[str, list[JobDefinition]] = defaultdict(list)
        # Kept for the system check instead of raising at import time, so one run of
        # ``manage.py check`` lists every duplicate.
        self.duplicates: list[tuple[JobDefinition, JobDefinition]] = []
        # Called with a name nothing is registered under (task_jobs.py: a Django task's name is
        # its import path, so a worker imports a task's module when it first meets one).
        self._resolvers: list[Callable[[str], object]] = []
        self._unresolved: set[str] = set()

    def add_resolver(self, resolver: Callable[[str], object]) -> None:
        """``resolver(name)`` may register the job called ``name``; asked once per unknown name."""
        if resolver not in self._resolvers:
            self._resolvers.append(resolver)

    def register(self, definition: JobDefinition) -> None:
        existing = self._jobs.get(definition.name)
        if existing is not None:
            if _same_handler(existing, definition):
                return  # the same module imported twice (e.g. autoreload): not a conflict
            self.duplicates.append((existing, definition))
            return
        self._jobs[definition.name] = definition
        for trigger in definition.triggers:
            if isinstance(trigger, EventTrigger):
                for event in trigger.events:
                    self._by_event[event].append(definition)

    def get(self, name: str) -> JobDefinition:
        """The job called ``name``; UnknownJob (with close matches) if there is none."""
        if not isinstance(name, str):
            raise UnknownJob(repr(name), [])
        definition = self.find(name)
        if definition is None:
            raise UnknownJob(name, difflib.get_close_matches(name, list(self._jobs), n=3))
        return definition

    def find(self, name: str) -> JobDefinition | None:
        definition = self._jobs.get(name)
        if definition is None and self._resolvers:
            return self._resolve(name)
        return definition

    def _resolve(self, name: str) -> JobDefinition | None:
        if name in self._unresolved:
            return None
        for resolver in self._resolvers:
            resolver(name)
            if name in self._jobs:
                return self._jobs[name]
        if len(self._unresolved) > 10_000:  # names from a poisoned queue must not grow memory
            self._unresolved.clear()
        self._unresolved.add(name)
        return None

    def for_event(self, event: str) -> list[JobDefinition]:
        return list(self._by_event.get(event, ()))

    def events(self) -> list[str]:
        """Every event name some job listens to."""
        return [event for event, jobs in self._by_event.items() if jobs]

    def all(self) -> list[JobDefinition]:
        return list(self._jobs.values())

    def __contains__(self, name: object) -> bool:
        return name in self._jobs

    @contextmanager
    def isolated(self) -> Iterator[JobRegistry]:
        """Temporarily swap in an empty registry (for tests that declare throwaway jobs)."""
        saved = (self._jobs, self._by_event, self.duplicates, self._unresolved)
        self._jobs, self._by_event, self.duplicates, self._unresolved = {}, defaultdict(list), [], set()
        try:
            yield self
        finally:
            self._jobs, self._by_event, self.duplicates, self._unresolved = saved


def _same_handler(a: JobDefinition, b: JobDefinition) -> bool:
    return (a.func.__module__, a.func.__qualname__) == (b.func.__module__, b.func.__qualname__)


registry = JobRegistry()


@overload
def job(name: Handler, /) -> Handler: ...
@overload
def job(name: str | None = None, /, **options: Any) -> Callable[[Handler], Handler]: ...


def job(name: str | Handler | None = None, /, **options: Any) -> Any:
    """Declare a job: ``@job`` or ``@job("billing.export", trigger=cron("0 7 * * *"), retries=3)``.

    Options are those of ``JobDefinition``; ``trigger`` takes one trigger or a list. The name
    defaults to ``"<app_label>.<function name>"``. Registration happens at import time; the
    system checks (``manage.py check``) report invalid options.
    """
    if callable(name):
        return job()(name)
    job_name: str | None = options.pop("name", name)

    def decorate(func: Handler) -> Handler:
        registry.register(build_definition(func, job_name, options))
        return func

    return decorate


def build_definition(func: Handler, name: str | None, options: Mapping[str, Any]) -> JobDefinition:
    opts = dict(options)
    declared = dict(opts)
    triggers = _normalise_triggers(opts.pop("trigger", ManualTrigger()))
    known = {
        f
        for f in JobDefinition.__dataclass_fields__
        if f not in ("name", "func", "triggers", "declared", "task")
    }
    unknown = set(opts) - known
    if unknown:
        # A typo in an option would otherwise silently disable it.
        raise TypeError(f"@job got unknown option(s) {sorted(unknown)}; valid options: {sorted(known)}")
    if "backoff" in opts:
        opts["backoff"] = _normalise_backoff(opts["backoff"])
    if "max_per_tenant" in opts:
        opts["max_per_tenant"] = _normalise_max_per_tenant(opts["max_per_tenant"])
    if isinstance(opts.get("escape_hatch"), EscapeHatch):
        opts["escape_hatch"] = EscapeHatch(opts["escape_hatch"].reason, tuple(opts["escape_hatch"].grants))
    return JobDefinition(
        name=name or default_job_name(func), func=func, triggers=triggers, declared=declared, **opts
    )


def default_job_name(func: Handler) -> str:
    from django.apps import apps

    module = getattr(func, "__module__", "") or ""
    app = apps.get_containing_app_config(module) if apps.apps_ready else None
    label = app.label if app is not None else module.rsplit(".", 1)[0]
    return f"{label}.{getattr(func, '__name__', 'job')}"


def _normalise_backoff(value: Any) -> Any:
    if isinstance(value, str) and value in ("fixed", "exponential"):
        return Backoff(value)  # type: ignore[arg-type]
    return value


def _normalise_max_per_tenant(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return MaxPerTenant(limit=value)
    return value


def _normalise_triggers(value: Any) -> tuple[Any, ...]:
    if isinstance(value, list | tuple):
        return tuple(value)
    return (value,)
