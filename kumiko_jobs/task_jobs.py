"""A Django ``@task`` as a kumiko job: its definition and its lane.

A task is registered as a job named by its import path (``Task.module_path``, what Django's log
lines call ``path=``) when its backend validates it, i.e. when its module is imported. The
job's handler is the task runner (task_execution.run_task), its options come from the task
(task_class.KumikoTask), and its runs wait in priority-ordered flows (gates.py). A process
that meets a task's name before its module was imported (a worker, the admin) imports it: the
registry's resolver in backends.py. The payload of a task's run is task_payloads.py's.

Queues are lanes: ``"worker"``, ``"api"``, and ``"default"`` (the queue Django gives a task
declared without ``queue_name``), which is the worker lane.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.tasks import DEFAULT_TASK_QUEUE_NAME, Task

from kumiko_jobs.definitions import JobDefinition, MaxPerTenant
from kumiko_jobs.registry import build_definition, registry
from kumiko_jobs.task_execution import run_task

if TYPE_CHECKING:
    AnyTask = Task[..., Any]

logger = logging.getLogger("kumiko_jobs")

QUEUE_LANES: Mapping[str, str] = {DEFAULT_TASK_QUEUE_NAME: "worker", "worker": "worker", "api": "api"}
_OPTIONS = ("retries", "backoff", "timeout", "max_per_tenant")
# (job name, lane) -> (registered definition, its variant on that lane)
_on_lanes: dict[tuple[str, str], tuple[JobDefinition, JobDefinition]] = {}


def lane_of(queue_name: str) -> str | None:
    """The lane a task queue name stands for, or None for a name that is not a lane."""
    return QUEUE_LANES.get(queue_name)


def register_task(task: AnyTask) -> JobDefinition:
    """The job ``task`` runs as, registered on first sight (the registry keeps the first
    declaration of a name: re-decorating a function does not change its job)."""
    existing = registry.find(task.module_path) if task.module_path in registry else None
    if existing is not None and existing.task is not None and existing.task.func is task.func:
        return existing
    definition = build_definition_for(task)
    registry.register(definition)
    return registry.find(task.module_path) or definition


def build_definition_for(task: AnyTask) -> JobDefinition:
    options: dict[str, Any] = {"lane": lane_of(task.queue_name) or task.queue_name}
    for name in _OPTIONS:
        value = getattr(task, name, None)
        if value not in (None, 0):
            options[name] = value
    if isinstance(options.get("max_per_tenant"), int) and not isinstance(options["max_per_tenant"], bool):
        # A task's cap makes runs over it wait: an enqueue must return a result, never skip.
        options["max_per_tenant"] = MaxPerTenant(options["max_per_tenant"], on_limit="defer")
    definition = build_definition(run_task, task.module_path, options)
    return dataclasses.replace(definition, task=task)


def definition_for(task: AnyTask) -> JobDefinition:
    """The job to dispatch for ``task``: its registered definition, on its queue's lane."""
    base = register_task(task)
    if base.task is None:
        from django.tasks.exceptions import InvalidTask

        raise InvalidTask(
            f"{task.module_path!r} is also the name of a @job (manage.py check reports it as E002); "
            "give the job another name with @job(name=...)."
        )
    lane = lane_of(task.queue_name) or base.lane
    if lane == base.lane:
        return base
    cached = _on_lanes.get((base.name, lane))
    if cached is None or cached[0] is not base:
        cached = (base, dataclasses.replace(base, lane=lane))
        _on_lanes[(base.name, lane)] = cached
    return cached[1]


def on_run_lane(definition: JobDefinition, lane: str) -> JobDefinition:
    """The definition to push a recorded run with: a task's run keeps the lane its queue_name
    chose (``.using(queue_name=...)``); a job's follows its declaration."""
    if definition.task is None or lane == definition.lane or lane not in set(QUEUE_LANES.values()):
        return definition
    return dataclasses.replace(definition, lane=lane)


def retry_placement(
    definition: JobDefinition, lane: str, payload: Mapping[str, Any], now: datetime
) -> tuple[JobDefinition, dict[str, Any]]:
    """A retry of a task's run by hand: the same lane (and priority, in the payload), enqueued
    ``now``."""
    on_lane = on_run_lane(definition, lane)
    body = dict(payload)
    options = body.get("task")
    if isinstance(options, dict):
        body["task"] = {**options, "enqueued_at": now.isoformat()}
    return on_lane, body
