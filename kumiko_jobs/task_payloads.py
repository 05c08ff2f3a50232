"""The payload of a Django task's run: its arguments and what ``.using()`` chose, written by
``KumikoTaskBackend.enqueue()`` (backends.py) and read back by the task runner
(task_execution.py), the results (task_results.py) and dispatch's priority (dispatching.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

# Django's defaults of the .using() options (django.tasks.base), spelled out so this module
# imports nothing of django.tasks at run time.
DEFAULT_TASK_PRIORITY = 0
DEFAULT_TASK_QUEUE_NAME = "default"
DEFAULT_TASK_BACKEND_ALIAS = "default"

if TYPE_CHECKING:
    from django.tasks import Task

    AnyTask = Task[..., Any]


@dataclass(frozen=True)
class TaskCall:
    """One run's task (as enqueued: priority, queue, backend, run_after) and arguments."""

    task: AnyTask
    args: list[Any]
    kwargs: dict[str, Any]
    enqueued_at: datetime | None


def envelope(task: AnyTask, call: dict[str, Any], enqueued_at: datetime) -> dict[str, Any]:
    """The payload of a task's run: its arguments (``call``: ``{"args": [...], "kwargs": {...}}``,
    already validated) and what ``.using()`` chose (valid by construction). An option at
    Django's default is left out (``decode_call`` reads it back as that default): every byte is
    encoded, written to Redis and to the row of every run."""
    options: dict[str, Any] = {"enqueued_at": enqueued_at.isoformat()}
    if task.priority != DEFAULT_TASK_PRIORITY:
        options["priority"] = task.priority
    if task.queue_name != DEFAULT_TASK_QUEUE_NAME:
        options["queue_name"] = task.queue_name
    if task.backend != DEFAULT_TASK_BACKEND_ALIAS:
        options["backend"] = task.backend
    if task.run_after is not None:
        options["run_after"] = task.run_after.isoformat()
    return {**call, "task": options}


def task_priority(payload: Mapping[str, Any]) -> int:
    """The priority a task's run waits with in its ordered flow (0 if the payload has none)."""
    options = payload.get("task")
    priority = options.get("priority") if isinstance(options, Mapping) else None
    if isinstance(priority, float) and priority.is_integer():
        # Django's validation takes a whole float (5.0), and its Task keeps it so.
        return int(priority)
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else 0


def decode_call(base: AnyTask, payload: Mapping[str, Any]) -> TaskCall:
    """The call a run's payload describes; ValueError if it is not a task's payload."""
    try:
        options = payload["task"]
        args, kwargs = list(payload["args"]), dict(payload["kwargs"])
        run_after = options.get("run_after")
        enqueued_at = options.get("enqueued_at")
        task = base.using(
            priority=int(options.get("priority", DEFAULT_TASK_PRIORITY)),
            queue_name=str(options.get("queue_name", DEFAULT_TASK_QUEUE_NAME)),
            backend=str(options.get("backend", DEFAULT_TASK_BACKEND_ALIAS)),
            run_after=datetime.fromisoformat(run_after) if run_after else None,
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"the payload of a run of task {base.module_path!r} is not what KumikoTaskBackend.enqueue() "
            f"writes ({exc.__class__.__name__}: {exc}); enqueue tasks with .enqueue(), not dispatch()"
        ) from exc
    return TaskCall(task, args, kwargs, datetime.fromisoformat(enqueued_at) if enqueued_at else None)
