"""Checks of a ``TASKS`` alias that uses ``KumikoTaskBackend`` (ids E502-E505).

Django passes every ``TASKS[alias]`` key to the backend and ignores the ones it does not know;
kumiko reports them, and the queue names that are not lanes. Django runs these through
``BaseTaskBackend.check()`` for every configured alias.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from django.core.checks import CheckMessage, Error

from kumiko_jobs.task_jobs import QUEUE_LANES

KNOWN_KEYS = ("BACKEND", "QUEUES", "OPTIONS")
Problem = tuple[str, str, str]  # message, hint, id suffix


def check_task_backend(alias: str, params: Mapping[str, Any]) -> list[CheckMessage]:
    return [
        Error(f"TASKS[{alias!r}]: {message}", hint=hint, id=f"kumiko_jobs.{code}")
        for rule in (_queues, _keys, _options)
        for message, hint, code in rule(params)
    ]


def _queues(params: Mapping[str, Any]) -> Iterator[Problem]:
    if "QUEUES" not in params:
        return
    queues = params["QUEUES"]
    valid = ", ".join(repr(name) for name in QUEUE_LANES)
    if not isinstance(queues, list | tuple) or not all(isinstance(q, str) for q in queues):
        yield (
            f"QUEUES = {queues!r} is not a list of queue names.",
            f"List kumiko's queues ({valid}), or leave QUEUES out to allow them all.",
            "E502",
        )
        return
    if not queues:
        yield (
            "QUEUES = [] would turn Django's queue validation off, but every queue of "
            "KumikoTaskBackend must be a lane.",
            f"List the queues to allow ({valid}), or leave QUEUES out to allow them all.",
            "E503",
        )
    for name in queues:
        if name not in QUEUE_LANES:
            yield (
                f"queue {name!r} in QUEUES is not a kumiko lane.",
                f"KumikoTaskBackend's queues are {valid} ('default' runs on the worker lane).",
                "E502",
            )


def _keys(params: Mapping[str, Any]) -> Iterator[Problem]:
    for key in sorted(set(params) - set(KNOWN_KEYS)):
        yield (
            f"{key!r} is not a setting of KumikoTaskBackend; Django would ignore it.",
            f"Known keys: {', '.join(KNOWN_KEYS)}.",
            "E504",
        )


def _options(params: Mapping[str, Any]) -> Iterator[Problem]:
    options = params.get("OPTIONS")
    if options:
        yield (
            f"OPTIONS {options!r}: KumikoTaskBackend has no options.",
            "Remove OPTIONS; kumiko's settings live in KUMIKO_JOBS, a task's options in @task(...).",
            "E505",
        )
