"""The job registry: every ``@job`` of every installed app, looked up by name or event."""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

from kumiko_jobs.definitions import EventTrigger, JobDefinition
from kumiko_jobs.exceptions import UnknownJob


class JobRegistry:
    def __init__(self) -> None:
        self._jobs: dict[str, JobDefinition] = {}
        self._by_event: dict[str, list[JobDefinition]] = defaultdict(list)
        # Kept for the system check instead of raising at import time, so one run of
        # ``manage.py check`` lists every duplicate.
        self.duplicates: list[tuple[JobDefinition, JobDefinition]] = []

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
        try:
            return self._jobs[name]
        except KeyError:
            raise UnknownJob(name, difflib.get_close_matches(name, list(self._jobs), n=3)) from None

    def find(self, name: str) -> JobDefinition | None:
        return self._jobs.get(name)

    def for_event(self, event: str) -> list[JobDefinition]:
        return list(self._by_event.get(event, ()))

    def all(self) -> list[JobDefinition]:
        return list(self._jobs.values())

    def __contains__(self, name: object) -> bool:
        return name in self._jobs

    @contextmanager
    def isolated(self) -> Iterator[JobRegistry]:
        """Temporarily swap in an empty registry (for tests that declare throwaway jobs)."""
        saved = (self._jobs, self._by_event, self.duplicates)
        self._jobs, self._by_event, self.duplicates = {}, defaultdict(list), []
        try:
            yield self
        finally:
            self._jobs, self._by_event, self.duplicates = saved


def _same_handler(a: JobDefinition, b: JobDefinition) -> bool:
    return (a.func.__module__, a.func.__qualname__) == (b.func.__module__, b.func.__qualname__)


registry = JobRegistry()
