"""Django 6.1.3 ``tests/tasks/test_dummy_backend.py`` against KumikoTaskBackend.

DummyBackend keeps results in memory and never runs them; with no worker running, a kumiko
task is READY the same way, and its result comes back from the run record.

Not applicable, with the reason:

- the ``assertIn(result, default_task_backend.results)`` lines of ``test_enqueue_task`` and
  ``test_enqueue_task_async``: ``results`` is DummyBackend's in-memory list; here the same
  result is read back from the database with ``get_result`` instead.
- ``test_refresh_result``, ``test_refresh_result_async`` as written edit DummyBackend's stored
  object; here a worker runs the task between ``enqueue()`` and ``refresh()`` instead.
- ``test_clear``: ``clear()`` is DummyBackend's API; run records are kept (and pruned) by kumiko.
- ``DummyBackendTransactionTestCase.test_doesnt_wait_until_transaction_commit_by_default``:
  kumiko waits for the commit; test_immediate_backend.py's
  ``ImmediateBackendTransactionTestCase`` checks that.
"""

from __future__ import annotations

from typing import Any, cast
from unittest import mock

from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.base import Task
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.test import TransactionTestCase, override_settings

from kumiko_jobs.backends import KumikoTaskBackend
from tests.django_tasks.support import BACKEND, KUMIKO_TASKS, arun_worker, run_worker
from tests.run_invariants import CheckedRunRows
from tests.testapp import tasks as test_tasks


@override_settings(TASKS=KUMIKO_TASKS)
class DummyBackendTestCase(CheckedRunRows, TransactionTestCase):
    def test_using_correct_backend(self) -> None:
        self.assertEqual(default_task_backend, task_backends["default"])
        self.assertIsInstance(task_backends["default"], KumikoTaskBackend)
        self.assertEqual(default_task_backend.alias, "default")
        self.assertEqual(default_task_backend.options, {})

    def test_enqueue_task(self) -> None:
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task):
                result = cast("Task[..., Any]", task).enqueue(1, two=3)

                self.assertEqual(result.status, TaskResultStatus.READY)
                self.assertIs(result.is_finished, False)
                self.assertIsNone(result.started_at)
                self.assertIsNone(result.last_attempted_at)
                self.assertIsNone(result.finished_at)
                with self.assertRaisesMessage(ValueError, "Task has not finished yet"):
                    result.return_value  # noqa: B018
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [1])
                self.assertEqual(result.kwargs, {"two": 3})
                self.assertEqual(result.attempts, 0)

                self.assertEqual(default_task_backend.get_result(result.id), result)

    async def test_enqueue_task_async(self) -> None:
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task):
                result = await cast("Task[..., Any]", task).aenqueue()

                self.assertEqual(result.status, TaskResultStatus.READY)
                self.assertIs(result.is_finished, False)
                self.assertIsNone(result.started_at)
                self.assertIsNone(result.last_attempted_at)
                self.assertIsNone(result.finished_at)
                with self.assertRaisesMessage(ValueError, "Task has not finished yet"):
                    result.return_value  # noqa: B018
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [])
                self.assertEqual(result.kwargs, {})
                self.assertEqual(result.attempts, 0)

                self.assertEqual(await default_task_backend.aget_result(result.id), result)

    def test_get_result(self) -> None:
        result = default_task_backend.enqueue(test_tasks.noop_task, (), {})

        new_result = default_task_backend.get_result(result.id)

        self.assertEqual(result, new_result)

    async def test_get_result_async(self) -> None:
        result = await default_task_backend.aenqueue(test_tasks.noop_task, (), {})

        new_result = await default_task_backend.aget_result(result.id)

        self.assertEqual(result, new_result)

    def test_refresh_result(self) -> None:
        result = default_task_backend.enqueue(test_tasks.calculate_meaning_of_life, (), {})
        run_worker()

        self.assertEqual(result.status, TaskResultStatus.READY)
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, 42)

    async def test_refresh_result_async(self) -> None:
        result = await default_task_backend.aenqueue(test_tasks.calculate_meaning_of_life, (), {})
        await arun_worker()

        self.assertEqual(result.status, TaskResultStatus.READY)
        await result.arefresh()
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, 42)

    async def test_get_missing_result(self) -> None:
        with self.assertRaises(TaskResultDoesNotExist):
            default_task_backend.get_result("123")

        with self.assertRaises(TaskResultDoesNotExist):
            await default_task_backend.aget_result("123")

        with self.assertRaises(TaskResultDoesNotExist):
            await default_task_backend.aget_result("6f1c1ef4-58c6-4a35-a3b4-64cb6c1b0a44")

    def test_enqueue_logs(self) -> None:
        with self.assertLogs("django.tasks", level="DEBUG") as captured_logs:
            result = test_tasks.noop_task.enqueue()

        self.assertEqual(len(captured_logs.output), 1)
        self.assertIn("enqueued", captured_logs.output[0])
        self.assertIn(result.id, captured_logs.output[0])

    def test_errors(self) -> None:
        result = test_tasks.noop_task.enqueue()
        self.assertEqual(result.errors, [])

    def test_validate_disallowed_async_task(self) -> None:
        with (
            mock.patch.multiple(default_task_backend, supports_async_task=False),
            self.assertRaisesMessage(InvalidTask, "Backend does not support async Tasks."),
        ):
            default_task_backend.validate_task(test_tasks.noop_task_async)

    def test_check(self) -> None:
        errors = list(default_task_backend.check())
        self.assertEqual(len(errors), 0, errors)

    def test_takes_context(self) -> None:
        result = test_tasks.get_task_id.enqueue()
        self.assertEqual(result.status, TaskResultStatus.READY)

    # Built under a queue valid now, enqueued where it is not (QUEUES [] cannot turn this
    # backend's validation off: every queue is a lane).
    def test_validate_on_enqueue(self) -> None:
        task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="api")

        with (
            override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["worker"]}}),
            self.assertRaisesMessage(InvalidTask, "Queue 'api' is not valid for backend"),
        ):
            task_with_custom_queue_name.enqueue()

    async def test_validate_on_aenqueue(self) -> None:
        task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="api")

        with (
            override_settings(TASKS={"default": {"BACKEND": BACKEND, "QUEUES": ["worker"]}}),
            self.assertRaisesMessage(InvalidTask, "Queue 'api' is not valid for backend"),
        ):
            await task_with_custom_queue_name.aenqueue()
