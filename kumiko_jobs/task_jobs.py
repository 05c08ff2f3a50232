"""A Django ``@task`` as a kumiko job: its definition, its lane, and the payload of its runs.

A task is registered as a job named by its import path (``Task.module_path``, what Django's log
lines call ``path=``) when its backend validates it, i.e. when its module is imported. The
job's handler is the task runner (task_execution.run_task), its options come from the task
(task_class.KumikoTask), and its runs wait in priority-ordered flows (gates.py). A process
that meets a task's name before its module was imported (a worker, the admin) imports it: the
registry's resolver below.

Queues are lanes: ``"worker"``, ``"api"``, and ``"default"`` (the queue Django gives a task
declared without ``queue_name``), which is the worker lane.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.tasks import DEFAULT_TASK_QUEUE_NAME, Task
from django.utils.module_loading import import_string

from kumiko_jobs.definitions import JobDefinition, MaxPerTenant
from kumiko_jobs.registry import build_definition, registry

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
    from kumiko_jobs.task_execution import run_task

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


def import_task(name: str) -> None:
    """Registry resolver: import the task called ``name`` (its module registers it)."""
    if "." not in name:
        return
    try:
        found = import_string(name)
    except ImportError:
        return
    except Exception:  # a broken module must not take the worker down: the run is "unknown"
        logger.exception("kumiko_jobs: importing %s to find a Django task failed", name)
        return
    if isinstance(found, Task) and found.module_path == name:
        from kumiko_jobs.backends import KumikoTaskBackend

        if isinstance(found.get_backend(), KumikoTaskBackend):
            register_task(found)


registry.add_resolver(import_task)


# --- the payload of a task's run ---------------------------------------------------------------


@dataclass(frozen=True)
class TaskCall:
    """One run's task (as enqueued: priority, queue, backend, run_after) and arguments."""

    task: AnyTask
    args: list[Any]
    kwargs: dict[str, Any]
    enqueued_at: datetime | None


def envelope(task: AnyTask, call: dict[str, Any], enqueued_at: datetime) -> dict[str, Any]:
    """The payload of a task's run: its arguments (``call``: ``{"args": [...], "kwargs": {...}}``,
    already validated) and what ``.using()`` chose (valid by construction)."""
    return {
        **call,
        "task": {
            "priority": task.priority,
            "queue_name": task.queue_name,
            "backend": task.backend,
            "run_after": task.run_after.isoformat() if task.run_after else None,
            "enqueued_at": enqueued_at.isoformat(),
        },
    }


def task_priority(payload: Mapping[str, Any]) -> int:
    """The priority a task's run waits with in its ordered flow (0 if the payload has none)."""
    options = payload.get("task")
    priority = options.get("priority") if isinstance(options, Mapping) else None
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else 0


def decode_call(base: AnyTask, payload: Mapping[str, Any]) -> TaskCall:
    """The call a run's payload describes; ValueError if it is not a task's payload."""
    try:
        options = payload["task"]
        args, kwargs = list(payload["args"]), dict(payload["kwargs"])
        run_after = options.get("run_after")
        enqueued_at = options.get("enqueued_at")
        task = base.using(
            priority=int(options["priority"]),
            queue_name=str(options["queue_name"]),
            backend=str(options["backend"]),
            run_after=datetime.fromisoformat(run_after) if run_after else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"the payload of a run of task {base.module_path!r} is not what KumikoTaskBackend.enqueue() "
            f"writes ({exc.__class__.__name__}: {exc}); enqueue tasks with .enqueue(), not dispatch()"
        ) from exc
    return TaskCall(task, args, kwargs, datetime.fromisoformat(enqueued_at) if enqueued_at else None)


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
