"""Running a Django task's attempt in a worker, and Django's ``task_started``/``task_finished``.

``run_task`` is the handler of every task's job (task_jobs.py). It rebuilds the task as it was
enqueued, sends ``task_started`` (sender: the backend class, as Django sends it) with a RUNNING
``TaskResult``, calls the function (a coroutine function on the thread's event loop) with a
``TaskContext`` first if the task takes one, inside the task's timeout, and returns its return
value, checked to be JSON the run record can store. kumiko's outcome policy then records the
attempt like any job's; ``attempt_ended`` (called by run_events.py after that write) sends
``task_finished`` once the run is final: SUCCESSFUL, or FAILED with the exception being handled,
so Django's log line carries the traceback. A retried attempt sends nothing: the task is READY
again. Receivers that raise are logged; they never fail a run or stop a worker.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

from kumiko_jobs.async_handlers import run_coroutine
from kumiko_jobs.conf import get_config
from kumiko_jobs.exceptions import InvalidPayload, marked_final
from kumiko_jobs.task_payloads import decode_call
from kumiko_jobs.timeouts import enforce_timeout
from kumiko_jobs.validation import validate_payload

if TYPE_CHECKING:
    from django.dispatch import Signal

    from kumiko_jobs.context import JobContext
    from kumiko_jobs.definitions import JobDefinition
    from kumiko_jobs.jobdata import JobMeta

    AnyResult = TaskResult[..., Any]

logger = logging.getLogger("kumiko_jobs")


@dataclass
class _Attempt:
    """A task attempt running in this process: what task_finished needs once it is recorded."""

    result: AnyResult
    returned: Any = None


# run id -> its running attempt; one thread runs a given run, so plain dict operations suffice.
_running: dict[str, _Attempt] = {}
_running_lock = threading.Lock()


def run_task(payload: dict[str, Any], ctx: JobContext) -> Any:
    """The handler of a Django task's runs: call the task and return its JSON return value."""
    from kumiko_jobs.task_results import earlier_attempts

    definition = ctx.definition
    if definition.task is None:
        raise TypeError(f"Job {ctx.job_name!r} is not a Django task")
    call = decode_call(definition.task, payload)
    task = call.task
    errors, worker_ids = earlier_attempts(ctx.run_id) if ctx.attempt > 1 else ([], [])
    now = timezone.now()
    running = TaskResult(
        task=task,
        id=ctx.run_id,
        status=TaskResultStatus.RUNNING,
        enqueued_at=call.enqueued_at,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=call.args,
        kwargs=call.kwargs,
        backend=task.backend,
        errors=errors,
        worker_ids=[*worker_ids, ctx.worker],
    )
    attempt = _Attempt(running)
    with _running_lock:
        _running[ctx.run_id] = attempt
    _send(task_started, type(task.get_backend()), running)
    args: tuple[Any, ...] = tuple(call.args)
    if task.takes_context:
        args = (TaskContext(task_result=running), *args)
    if inspect.iscoroutinefunction(task.func):
        value = run_coroutine(
            task.func, args, kwargs=call.kwargs, timeout=definition.timeout, job_name=definition.name
        )
    else:
        with enforce_timeout(definition.timeout, definition.name):
            value = task.func(*args, **call.kwargs)
    attempt.returned = json_return_value(task.module_path, value)
    return attempt.returned


def json_return_value(path: str, value: Any) -> Any:
    """``value`` as Django normalises it (tuples become lists) and as JSON stores it (keys
    become strings, as a JSONField writes ``{1: "a"}``), if a run record can store it;
    TypeError naming the problem otherwise: the run fails, as with Django's backends, and is
    not retried (the task ran; another attempt would only repeat its side effects)."""
    try:
        normalised = json.loads(json.dumps(normalize_json(value)))
        validate_payload({"return": normalised})
    except (TypeError, ValueError) as exc:
        problem = exc.problem if isinstance(exc, InvalidPayload) else str(exc)
        raise marked_final(
            TypeError(
                f"Task {path!r} returned a value that is not JSON ({problem}); return str, int, "
                "float, bool, None, or lists and dicts of them, e.g. an id instead of a model instance."
            )
        ) from exc
    limit = int(get_config()["MAX_PAYLOAD_BYTES"])
    if normalised is not None and len(json.dumps(normalised)) > limit:
        raise marked_final(
            TypeError(
                f"Task {path!r} returned a value over KUMIKO_JOBS['MAX_PAYLOAD_BYTES'] = {limit:,} "
                "bytes of JSON; store large results elsewhere and return their id."
            )
        )
    return normalised


def forget_attempt(run_id: str) -> None:
    """A task attempt that ended without an outcome of its own (outcomes.stale: its run moved on
    while its worker stalled): nothing is said of it."""
    with _running_lock:
        _running.pop(run_id, None)


def attempt_ended(
    definition: JobDefinition, meta: JobMeta, outcome: str, *, final: bool, exc: BaseException | None
) -> None:
    """After a task attempt's outcome is recorded: ``task_finished`` if the run is final."""
    with _running_lock:
        attempt = _running.pop(meta.run_id, None)
    if not final or outcome not in ("succeeded", "failed"):
        return
    try:
        finished = _finished_result(attempt, meta.run_id, outcome, exc)
        sender = type(task_backends[finished.backend])
    except Exception:
        logger.exception("kumiko_jobs: could not build the finished TaskResult of run %s", meta.run_id)
        return
    if exc is None or outcome != "failed":
        _send(task_finished, sender, finished)
        return
    # Django sends a failed task's task_finished while the exception is handled; its log
    # receiver attaches the traceback from sys.exc_info().
    try:
        raise exc
    except BaseException:
        _send(task_finished, sender, finished)


def _finished_result(
    attempt: _Attempt | None, run_id: str, outcome: str, exc: BaseException | None
) -> AnyResult:
    from kumiko_jobs.task_results import get_task_result, task_error

    if attempt is None:
        # Ended outside its worker (the reaper failed an abandoned run): read the record.
        return get_task_result(run_id)
    running = attempt.result
    errors = list(running.errors)
    status = TaskResultStatus.SUCCESSFUL
    if outcome == "failed":
        status = TaskResultStatus.FAILED
        if exc is not None:
            errors.append(task_error(exc))
    finished = dataclasses.replace(running, status=status, finished_at=timezone.now(), errors=errors)
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(finished, "_return_value", attempt.returned)
    return finished


def _send(signal: Signal, sender: type[Any], result: AnyResult) -> None:
    for receiver, error in signal.send_robust(sender, task_result=result):
        if isinstance(error, Exception):
            logger.error(
                "kumiko_jobs: a receiver of a Django task signal failed: %r (run %s)",
                receiver,
                result.id,
                exc_info=error,
            )
