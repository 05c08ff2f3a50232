"""``KumikoTaskBackend``: Django's tasks framework (``django.tasks``) on kumiko_jobs.

``TASKS = {"default": {"BACKEND": "kumiko_jobs.backends.KumikoTaskBackend"}}`` makes every
``@task`` a kumiko job (task_jobs.py) and every ``.enqueue()`` a kumiko run, through the same
path as ``dispatch()``: a run record, its tenant's flow on the lane named by ``queue_name``,
caps, retries, the admin, crash repair.

- The tenant is the current one (``kumiko_jobs.tenancy.current_tenant_id()``: a job's own tenant
  inside a job, ``tenant_context(...)`` in a request), never an argument.
- ``priority`` orders the runs of one tenant's flow (higher first); it never lets one tenant's
  runs overtake another's (the lane still serves tenants in turn).
- ``run_after`` delays the run through the lane's scheduled set.
- Inside ``transaction.atomic()`` the run is recorded at once and reaches Redis on commit, and
  ``task_enqueued`` is sent then; a rollback leaves neither. (Django's own backends act at once.)
- Results are read from the run record (task_results.py); a task returns JSON or fails.
- ``QUEUES`` may list ``"worker"``, ``"api"`` and ``"default"`` (Django's name for a task
  declared without ``queue_name``, run on the worker lane and valid whenever ``"worker"`` is);
  without ``QUEUES`` all three are valid. ``OPTIONS`` has no keys yet.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from django.core.checks import CheckMessage
from django.db import router, transaction
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.module_loading import import_string

from kumiko_jobs.definitions import MaxPerTenant
from kumiko_jobs.models import JobRun
from kumiko_jobs.registry import registry
from kumiko_jobs.run_ids import new_run_id
from kumiko_jobs.task_class import KumikoTask
from kumiko_jobs.task_jobs import QUEUE_LANES, definition_for, lane_of, register_task
from kumiko_jobs.task_payloads import envelope

logger = logging.getLogger("kumiko_jobs")

P = ParamSpec("P")
R = TypeVar("R")

# How many validated (task, flags) pairs a backend remembers before it starts over.
VALIDATED_TASKS = 1024


class KumikoTaskBackend(BaseTaskBackend):
    """Runs Django tasks as kumiko runs; see the module docstring."""

    task_class = KumikoTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # Kept for check(): Django ignores keys it does not know, kumiko reports them.
        self.params = dict(params)
        queues = params.get("QUEUES")
        if queues is None:
            self.queues = set(QUEUE_LANES)
        elif isinstance(queues, list | tuple | set):
            self.queues = set(queues) | ({"default"} if "worker" in queues else set())
        # Tasks enqueue() validated, with the feature flags they were validated under. A Task is
        # frozen and changed settings make a new backend, so one that passed stays valid; this
        # spares each enqueue ~10 us of ~650 us. Bounded: every .using(run_after=...) makes a
        # new Task. validate_task() itself always checks (tests patch the flags).
        self._validated: set[tuple[Task[..., Any], bool, bool, bool]] = set()

    def _validate_for_enqueue(self, task: Task[..., Any]) -> None:
        key = (task, self.supports_defer, self.supports_async_task, self.supports_priority)
        try:
            if key in self._validated:
                return
        except TypeError:  # an option value that cannot be hashed: validate every time
            self.validate_task(task)
            return
        self.validate_task(task)
        if len(self._validated) >= VALIDATED_TASKS:
            self._validated.clear()
        self._validated.add(key)

    def validate_task(self, task: Task[..., Any]) -> None:
        if task.run_after is not None and not isinstance(task.run_after, datetime):
            raise InvalidTask(
                f"run_after must be a datetime, got {type(task.run_after).__name__}; "
                "for a delay use .using(run_after=timezone.now() + timedelta(...))."
            )
        super().validate_task(task)  # a naive run_after with USE_TZ: Django's own message
        from kumiko_jobs.validation import MAX_DELAY_SECONDS

        ahead = _until(task.run_after, timezone.now()).total_seconds() if task.run_after is not None else 0.0
        if ahead > MAX_DELAY_SECONDS:
            # What dispatch() refuses as InvalidDispatch, refused where Django expects it.
            raise InvalidTask(
                f"run_after={task.run_after} is more than {MAX_DELAY_SECONDS // 86400} days "
                "ahead; schedule it closer, or store the date and enqueue it later."
            )
        if lane_of(task.queue_name) is None:
            raise InvalidTask(
                f"Queue {task.queue_name!r} is not valid for backend. KumikoTaskBackend's queues are "
                "kumiko's lanes: 'worker' (also 'default', the queue of a task without queue_name) "
                "and 'api'."
            )
        cap = getattr(task, "max_per_tenant", None)
        if isinstance(cap, MaxPerTenant) and cap.on_limit == "skip":
            # .enqueue() would return READY for a run the limit dropped. (A system check said
            # so before, which a project could silence.)
            raise InvalidTask(
                f'{task.module_path}: max_per_tenant with on_limit="skip" cannot run as a Django '
                "task: .enqueue() must return a result, so a task's runs over the cap wait instead. "
                f'Use max_per_tenant={cap.limit} or MaxPerTenant({cap.limit}, on_limit="defer").'
            )
        # First sight of a task (its module's import): it becomes a job (workers, admin).
        register_task(task)

    def enqueue(self, task: Task[P, R], args: list[Any], kwargs: dict[str, Any]) -> TaskResult[P, R]:
        from kumiko_jobs.dispatching import submit
        from kumiko_jobs.preparing import prepare
        from kumiko_jobs.tenancy import current_tenant_id, normalise_tenant
        from kumiko_jobs.validation import delay_seconds, validate_payload

        self._validate_for_enqueue(task)
        run_id = new_run_id()
        # Built first, as Django's backends do: arguments that are not JSON raise here, before
        # anything is written.
        result: TaskResult[P, R] = TaskResult(
            task=task,
            id=str(run_id),
            status=TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        now = timezone.now()
        call = validate_payload({"args": result.args, "kwargs": result.kwargs})
        payload = envelope(task, call, now)
        prepared = prepare(
            definition_for(task),
            payload,
            tenant_id=normalise_tenant(current_tenant_id()),
            user_id=None,
            delay=delay_seconds(_until(task.run_after, now)) if task.run_after else 0.0,
            run_id=run_id,
            now=now,
        )
        submit([prepared])
        object.__setattr__(result, "enqueued_at", now)
        using = router.db_for_write(JobRun)
        if transaction.get_connection(using).in_atomic_block:
            # Like the push: announced once committed, never for a rolled-back enqueue.
            # Robust: a receiver that raises must not come out of the caller's atomic() after
            # its COMMIT and cancel the on_commit callbacks after it (the next enqueue's push).
            transaction.on_commit(lambda: self._announce(result), using=using, robust=True)
        else:
            self._announce(result)
        return result

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        from kumiko_jobs.task_results import get_task_result

        return get_task_result(result_id)

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        from kumiko_jobs.checks.tasks import check_task_backend

        return check_task_backend(self.alias, self.params)

    def _announce(self, result: TaskResult[Any, Any]) -> None:
        task_enqueued.send(type(self), task_result=result)


def _until(run_after: datetime, now: datetime) -> timedelta:
    """How long until ``run_after``: aware or naive as Django allows it (naive only with USE_TZ
    off, in local time; an aware one then still compares with the current instant)."""
    if timezone.is_aware(run_after) and timezone.is_naive(now):
        return run_after - datetime.now(UTC)
    return run_after - now


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
        if isinstance(found.get_backend(), KumikoTaskBackend):
            register_task(found)


registry.add_resolver(import_task)
