"""A Django ``TaskResult`` read from a run record: what ``KumikoTaskBackend.get_result`` returns.

One SELECT by primary key (the result id is the run id). Statuses: queued and deferred runs
(waiting, scheduled by ``run_after``, or back for a retry) are READY, running is RUNNING,
succeeded is SUCCESSFUL with the stored return value, failed (and dropped) is FAILED.

Each failed attempt left an error line on the run (outcomes.py: its exception's class path and
the worker): they give ``errors`` and, with the worker of a running or successful attempt,
``worker_ids`` (so ``attempts`` counts attempts made). A run keeps the full traceback of its
latest failed attempt; earlier attempts keep their error line. ``started_at`` and
``last_attempted_at`` are the latest attempt's start; a run shows RUNNING only once
``RUNNING_MARK_DELAY`` has passed (shorter runs go from READY to their outcome).
"""

from __future__ import annotations

import traceback as tb
import uuid
from typing import TYPE_CHECKING, Any

from django.tasks import TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import TaskResultDoesNotExist

from kumiko_jobs.exceptions import TaskNotRun
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.registry import registry
from kumiko_jobs.scrubbing import scrub
from kumiko_jobs.task_payloads import decode_call

if TYPE_CHECKING:
    AnyResult = TaskResult[..., Any]

STATUSES = {
    RunStatus.QUEUED: TaskResultStatus.READY,
    RunStatus.DEFERRED: TaskResultStatus.READY,
    RunStatus.RUNNING: TaskResultStatus.RUNNING,
    RunStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    RunStatus.FAILED: TaskResultStatus.FAILED,
    RunStatus.DROPPED: TaskResultStatus.FAILED,
}
_COLUMNS = (
    "job_name", "status", "payload", "queued_at", "started_at", "finished_at", "worker", "logs",
    "traceback", "error", "result",
)  # fmt: skip
_NOT_RUN = f"{TaskNotRun.__module__}.{TaskNotRun.__qualname__}"


def get_task_result(result_id: Any) -> AnyResult:
    """The task result with this id; TaskResultDoesNotExist for anything that is not one."""
    try:
        run_id = uuid.UUID(str(result_id))
    except ValueError:
        raise TaskResultDoesNotExist(f"{result_id} (a task result id is a run's UUID)") from None
    row = JobRun.objects.filter(pk=run_id).values(*_COLUMNS).first()
    if row is None:
        raise TaskResultDoesNotExist(result_id)
    definition = registry.find(row["job_name"])
    if definition is None or definition.task is None:
        raise TaskResultDoesNotExist(f"{result_id} is a run of job {row['job_name']!r}, not of a Django task")
    try:
        call = decode_call(definition.task, row["payload"])
    except ValueError as exc:
        raise TaskResultDoesNotExist(f"{result_id}: {exc}") from None
    status = STATUSES[row["status"]]
    errors, worker_ids = _attempts(row, status)
    finished = status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
    result = TaskResult(
        task=call.task,
        id=str(run_id),
        status=status,
        enqueued_at=row["queued_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"] if finished else None,
        last_attempted_at=row["started_at"],
        args=call.args,
        kwargs=call.kwargs,
        backend=call.task.backend,
        errors=errors,
        worker_ids=worker_ids,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", row["result"])
    return result


def earlier_attempts(run_id: str) -> tuple[list[TaskError], list[str]]:
    """Errors and worker ids of a run's attempts so far (for a retry's RUNNING result)."""
    row = JobRun.objects.filter(pk=run_id).values(*_COLUMNS).first()
    if row is None:
        return [], []
    return _attempts(row, TaskResultStatus.READY)


def task_error(exc: BaseException) -> TaskError:
    """A TaskError for an exception raised in this process."""
    kind = type(exc)
    return _error(f"{kind.__module__}.{kind.__qualname__}", "".join(tb.format_exception(exc)))


def _attempts(row: dict[str, Any], status: TaskResultStatus) -> tuple[list[TaskError], list[str]]:
    lines = [line for line in row["logs"] or () if isinstance(line, dict) and line.get("exception")]
    errors = [_error(str(line["exception"]), f"{line.get('msg', '')}\n") for line in lines]
    if errors and row["traceback"]:
        # The run keeps the latest failed attempt's whole traceback.
        errors[-1] = _error(errors[-1].exception_class_path, row["traceback"])
    workers = [str(line.get("worker", "")) for line in lines]
    if status in (TaskResultStatus.RUNNING, TaskResultStatus.SUCCESSFUL):
        workers.append(row["worker"])
    elif status == TaskResultStatus.FAILED and not errors:
        # Failed without an attempt of its own (never reached Redis, refused at commit...).
        errors = [_error(_NOT_RUN, f"{row['error']}\n")]
    return errors, workers


def _error(exception_class_path: str, traceback: str) -> TaskError:
    # The one place a traceback enters a TaskError: scrubbed (KUMIKO_JOBS["SCRUBBER"]), also
    # when it comes from the record, which stores scrubbed text already (scrubbing twice is
    # harmless).
    return TaskError(exception_class_path=exception_class_path, traceback=scrub(traceback))
