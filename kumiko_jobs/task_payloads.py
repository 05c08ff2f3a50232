"""The payload of a Django task's run: its arguments and what ``.using()`` chose, written by
``KumikoTaskBackend.enqueue()`` (backends.py) and read back by the task runner
(task_execution.py), the results (task_results.py) and dispatch's priority (dispatching.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

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
