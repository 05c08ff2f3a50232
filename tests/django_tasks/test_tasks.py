"""Django 6.1.3 ``tests/tasks/test_tasks.py`` against KumikoTaskBackend.

Django runs these with DummyBackend as ``default``, ImmediateBackend as ``immediate`` (with
``QUEUES: []``) and a ``missing`` alias; here ``default`` is KumikoTaskBackend and the other two
are as in Django. Django's ``queue_1`` queue is the ``api`` lane here (queues are lanes).

Adapted, with the reason:

- the ``default_task_backend.results`` assertions of ``test_enqueue_task`` and
  ``test_enqueue_task_async`` (DummyBackend's in-memory list): the result is read back from the
  run record instead.
- ``test_refresh_result`` calls the synchronous ``refresh()`` inside an ``async def`` test; this
  backend reads the database, which Django refuses inside an event loop, so the sync call goes
  through ``sync_to_async``.
- ``test_task_error_invalid_exception``, ``test_task_error_unknown_module`` get their failed
  result from this backend (a worker runs the task) instead of ImmediateBackend.

Nothing is left out.
"""

from __future__ import annotations

import dataclasses
import pickle
from datetime import datetime

from asgiref.sync import sync_to_async
from django.tasks import DEFAULT_TASK_QUEUE_NAME, TaskResultStatus, default_task_backend, task, task_backends
from django.tasks.backends.immediate import ImmediateBackend
from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task
from django.tasks.exceptions import (
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultMismatch,
)
from django.test import TransactionTestCase, override_settings
from django.utils import timezone
from django.utils.module_loading import import_string

from kumiko_jobs.backends import KumikoTaskBackend
from kumiko_jobs.models import JobRun
from tests.django_tasks.support import BACKEND, run_worker
from tests.run_invariants import CheckedRunRows
from tests.testapp import tasks as test_tasks


@override_settings(
    TASKS={
        "default": {"BACKEND": BACKEND, "QUEUES": ["worker", "api"]},
        "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend", "QUEUES": []},
        "missing": {"BACKEND": "does.not.exist"},
    },
    USE_TZ=True,
)
class TaskTestCase(CheckedRunRows, TransactionTestCase):
    def test_using_correct_backend(self) -> None:
        self.assertEqual(default_task_backend, task_backends["default"])
        self.assertIsInstance(task_backends["default"], KumikoTaskBackend)

    def test_task_decorator(self) -> None:
        self.assertIsInstance(test_tasks.noop_task, Task)
        self.assertIsInstance(test_tasks.noop_task_async, Task)
        self.assertIsInstance(test_tasks.noop_task_from_bare_decorator, Task)

    def test_enqueue_task(self) -> None:
        result = test_tasks.noop_task.enqueue()

        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertEqual(result.task, test_tasks.noop_task)
        self.assertEqual(result.args, [])
        self.assertEqual(result.kwargs, {})

        self.assertEqual(default_task_backend.get_result(result.id), result)

    async def test_enqueue_task_async(self) -> None:
        result = await test_tasks.noop_task.aenqueue()

        self.assertEqual(result.status, TaskResultStatus.READY)
        self.assertEqual(result.task, test_tasks.noop_task)
        self.assertEqual(result.args, [])
        self.assertEqual(result.kwargs, {})

        self.assertEqual(await default_task_backend.aget_result(result.id), result)

    def test_enqueue_with_invalid_argument(self) -> None:
        with self.assertRaisesMessage(TypeError, "Unsupported type"):
            test_tasks.noop_task.enqueue(datetime.now())
        self.assertFalse(JobRun.objects.exists())  # nothing half-written

    async def test_aenqueue_with_invalid_argument(self) -> None:
        with self.assertRaisesMessage(TypeError, "Unsupported type"):
            await test_tasks.noop_task.aenqueue(datetime.now())

    def test_using_priority(self) -> None:
        self.assertEqual(test_tasks.noop_task.priority, 0)
        self.assertEqual(test_tasks.noop_task.using(priority=1).priority, 1)
        self.assertEqual(test_tasks.noop_task.priority, 0)

    def test_using_queue_name(self) -> None:
        self.assertEqual(test_tasks.noop_task.queue_name, DEFAULT_TASK_QUEUE_NAME)
        self.assertEqual(test_tasks.noop_task.using(queue_name="api").queue_name, "api")
        self.assertEqual(test_tasks.noop_task.queue_name, DEFAULT_TASK_QUEUE_NAME)

    def test_using_run_after(self) -> None:
        now = timezone.now()

        self.assertIsNone(test_tasks.noop_task.run_after)
        self.assertEqual(test_tasks.noop_task.using(run_after=now).run_after, now)
        self.assertIsNone(test_tasks.noop_task.run_after)

    def test_using_unknown_backend(self) -> None:
        self.assertEqual(test_tasks.noop_task.backend, "default")

        with self.assertRaisesMessage(InvalidTaskBackend, "The connection 'unknown' doesn't exist."):
            test_tasks.noop_task.using(backend="unknown")

    def test_using_missing_backend(self) -> None:
        self.assertEqual(test_tasks.noop_task.backend, "default")

        with self.assertRaisesMessage(
            InvalidTaskBackend, "Could not find backend 'does.not.exist': No module named 'does'"
        ):
            test_tasks.noop_task.using(backend="missing")

    def test_using_creates_new_instance(self) -> None:
        new_task = test_tasks.noop_task.using()

        self.assertEqual(new_task, test_tasks.noop_task)
        self.assertIsNot(new_task, test_tasks.noop_task)

    def test_chained_using(self) -> None:
        now = timezone.now()

        run_after_task = test_tasks.noop_task.using(run_after=now)
        self.assertEqual(run_after_task.run_after, now)

        priority_task = run_after_task.using(priority=10)
        self.assertEqual(priority_task.priority, 10)
        self.assertEqual(priority_task.run_after, now)

        self.assertEqual(run_after_task.priority, 0)

    async def test_refresh_result(self) -> None:
        result = await test_tasks.noop_task.aenqueue()

        original_result = dataclasses.asdict(result)

        await sync_to_async(result.refresh)()

        self.assertEqual(dataclasses.asdict(result), original_result)

        await result.arefresh()

        self.assertEqual(dataclasses.asdict(result), original_result)

    def test_naive_datetime(self) -> None:
        with self.assertRaisesMessage(InvalidTask, "run_after must be an aware datetime."):
            test_tasks.noop_task.using(run_after=datetime.now())

    def test_invalid_priority(self) -> None:
        message = f"priority must be a whole number between {TASK_MIN_PRIORITY} and {TASK_MAX_PRIORITY}."
        for priority in (-101, 101, 3.1):
            with self.subTest(priority), self.assertRaisesMessage(InvalidTask, message):
                test_tasks.noop_task.using(priority=priority)  # type: ignore[arg-type]

        test_tasks.noop_task.using(priority=100)
        test_tasks.noop_task.using(priority=-100)
        test_tasks.noop_task.using(priority=0)

    def test_unknown_queue_name(self) -> None:
        with self.assertRaisesMessage(InvalidTask, "Queue 'queue-2' is not valid for backend."):
            test_tasks.noop_task.using(queue_name="queue-2")
        # Validation is bypassed when the backend QUEUES is an empty list.
        self.assertEqual(
            test_tasks.noop_task.using(queue_name="queue-2", backend="immediate").queue_name, "queue-2"
        )

    def test_call_task(self) -> None:
        self.assertEqual(test_tasks.calculate_meaning_of_life.call(), 42)

    async def test_call_task_async(self) -> None:
        self.assertEqual(await test_tasks.calculate_meaning_of_life.acall(), 42)

    async def test_call_async_task(self) -> None:
        self.assertIsNone(await test_tasks.noop_task_async.acall())

    def test_call_async_task_sync(self) -> None:
        self.assertIsNone(test_tasks.noop_task_async.call())

    def test_get_result(self) -> None:
        result = default_task_backend.enqueue(test_tasks.noop_task, (), {})

        new_result = test_tasks.noop_task.get_result(result.id)

        self.assertEqual(result, new_result)

    async def test_get_result_async(self) -> None:
        result = await default_task_backend.aenqueue(test_tasks.noop_task, (), {})

        new_result = await test_tasks.noop_task.aget_result(result.id)

        self.assertEqual(result, new_result)

    async def test_get_missing_result(self) -> None:
        with self.assertRaises(TaskResultDoesNotExist):
            test_tasks.noop_task.get_result("123")

        with self.assertRaises(TaskResultDoesNotExist):
            await test_tasks.noop_task.aget_result("123")

    def test_get_incorrect_result(self) -> None:
        result = default_task_backend.enqueue(test_tasks.noop_task_async, (), {})
        with self.assertRaisesMessage(TaskResultMismatch, "Task does not match"):
            test_tasks.noop_task.get_result(result.id)

    async def test_get_incorrect_result_async(self) -> None:
        result = await default_task_backend.aenqueue(test_tasks.noop_task_async, (), {})
        with self.assertRaisesMessage(TaskResultMismatch, "Task does not match"):
            await test_tasks.noop_task.aget_result(result.id)

    def test_invalid_function(self) -> None:
        for invalid_function in [any, self.test_invalid_function]:
            with (
                self.subTest(invalid_function),
                self.assertRaisesMessage(InvalidTask, "Task function must be defined at a module level."),
            ):
                task()(invalid_function)

    def test_get_backend(self) -> None:
        self.assertEqual(test_tasks.noop_task.backend, "default")
        self.assertIsInstance(test_tasks.noop_task.get_backend(), KumikoTaskBackend)

        immediate_task = test_tasks.noop_task.using(backend="immediate")
        self.assertEqual(immediate_task.backend, "immediate")
        self.assertIsInstance(immediate_task.get_backend(), ImmediateBackend)

    def test_name(self) -> None:
        self.assertEqual(test_tasks.noop_task.name, "noop_task")
        self.assertEqual(test_tasks.noop_task_async.name, "noop_task_async")

    def test_module_path(self) -> None:
        self.assertEqual(test_tasks.noop_task.module_path, "tests.testapp.tasks.noop_task")
        self.assertEqual(test_tasks.noop_task_async.module_path, "tests.testapp.tasks.noop_task_async")

        self.assertIs(import_string(test_tasks.noop_task.module_path), test_tasks.noop_task)
        self.assertIs(import_string(test_tasks.noop_task_async.module_path), test_tasks.noop_task_async)

    def test_pickle_task(self) -> None:
        pickled_task = pickle.dumps(test_tasks.noop_task)
        unpickled_task = pickle.loads(pickled_task)  # noqa: S301

        self.assertEqual(unpickled_task, test_tasks.noop_task)

    def test_unpickle_arbitrary_string(self) -> None:
        kwargs = {"func": "does.not.exist.fake_task"}
        msg = "Expected 'does.not.exist.fake_task' to point to a Task instance."
        with self.assertRaisesMessage(ValueError, msg):
            Task._reconstruct(kwargs)  # type: ignore[attr-defined]

    def test_unpickle_non_task_object(self) -> None:
        kwargs = {"func": "builtins.any"}
        msg = "Expected 'builtins.any' to point to a Task instance."
        with self.assertRaisesMessage(ValueError, msg):
            Task._reconstruct(kwargs)  # type: ignore[attr-defined]

    def test_pickle_task_result(self) -> None:
        result = test_tasks.noop_task.enqueue()
        pickled_result = pickle.dumps(result)
        unpickled_result = pickle.loads(pickled_result)  # noqa: S301

        self.assertEqual(unpickled_result, result)

    @override_settings(TASKS={})
    def test_no_backends(self) -> None:
        with self.assertRaises(InvalidTaskBackend):
            test_tasks.noop_task.enqueue()

    def test_task_error_invalid_exception(self) -> None:
        failed = test_tasks.failing_task_value_error.enqueue()
        with self.assertLogs("django.tasks"):
            run_worker()
        failed.refresh()

        self.assertEqual(len(failed.errors), 1)

        object.__setattr__(failed.errors[0], "exception_class_path", "subprocess.run")

        with self.assertRaisesMessage(ValueError, "'subprocess.run' does not reference a valid exception."):
            failed.errors[0].exception_class  # noqa: B018

    def test_task_error_unknown_module(self) -> None:
        failed = test_tasks.failing_task_value_error.enqueue()
        with self.assertLogs("django.tasks"):
            run_worker()
        failed.refresh()

        self.assertEqual(len(failed.errors), 1)

        object.__setattr__(failed.errors[0], "exception_class_path", "does.not.exist")

        with self.assertRaises(ImportError):
            failed.errors[0].exception_class  # noqa: B018

    def test_takes_context_without_taking_context(self) -> None:
        with self.assertRaisesMessage(
            InvalidTask, "Task takes context but does not have a first argument of 'context'."
        ):
            task(takes_context=True)(test_tasks.calculate_meaning_of_life.func)

    def test_run_after_in_decorator(self) -> None:
        msg = "run_after cannot be defined statically with the @task decorator."
        with self.assertRaisesMessage(TypeError, msg):
            task(run_after=timezone.now())(test_tasks.calculate_meaning_of_life.func)  # type: ignore[call-overload]
