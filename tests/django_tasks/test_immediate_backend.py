"""Django 6.1.3 ``tests/tasks/test_immediate_backend.py`` against KumikoTaskBackend.

ImmediateBackend runs a task inside ``enqueue()``; here a worker drains the lanes between
``enqueue()`` and the assertions, which are made on the refreshed result. Log assertions span
the drain: the RUNNING and SUCCESSFUL/FAILED lines are written by the process that runs the
task (tests/integration/test_tasks_e2e.py checks them in a ``runjobs`` process's output).

Not applicable, with the reason:

- ``test_cannot_get_result``, ``test_cannot_refresh_result``: ImmediateBackend has no results
  store; this backend does (``supports_get_result``), see ``test_get_result`` in
  test_dummy_backend.py and ``test_refresh_result`` below.
- ``test_cannot_pass_run_after``: this backend supports ``run_after`` (``supports_defer``);
  ``test_run_after_delays_the_run`` checks the opposite.
- ``ImmediateBackendTransactionTestCase.test_doesnt_wait_until_transaction_commit_by_default``:
  kumiko does wait for the commit (a rolled-back enqueue leaves no run);
  ``test_waits_until_transaction_commit`` in the same class checks that instead.
- ``test_throws_keyboard_interrupt`` applies to the worker, not to ``enqueue()`` (which never
  runs the task): the KeyboardInterrupt leaves the worker (here the drain), nothing is logged.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask
from django.test import TransactionTestCase, override_settings
from django.utils import timezone

from kumiko_jobs.backends import KumikoTaskBackend
from kumiko_jobs.models import JobRun
from tests.django_tasks.support import BACKEND, KUMIKO_TASKS, arun_worker, run_worker
from tests.run_invariants import CheckedRunRows
from tests.testapp import tasks as test_tasks


@override_settings(TASKS=KUMIKO_TASKS)
class ImmediateBackendTestCase(CheckedRunRows, TransactionTestCase):
    def test_using_correct_backend(self) -> None:
        self.assertEqual(default_task_backend, task_backends["default"])
        self.assertIsInstance(task_backends["default"], KumikoTaskBackend)
        self.assertEqual(default_task_backend.alias, "default")
        self.assertEqual(default_task_backend.options, {})

    def test_enqueue_task(self) -> None:
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task):
                result = task.enqueue(1, two=3)
                run_worker()
                result.refresh()

                self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
                self.assertIs(result.is_finished, True)
                self.assertIsNotNone(result.started_at)
                self.assertIsNotNone(result.last_attempted_at)
                self.assertIsNotNone(result.finished_at)
                self.assertGreaterEqual(result.started_at, result.enqueued_at)
                self.assertGreaterEqual(result.finished_at, result.started_at)
                self.assertIsNone(result.return_value)
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [1])
                self.assertEqual(result.kwargs, {"two": 3})
                self.assertEqual(result.attempts, 1)

    async def test_enqueue_task_async(self) -> None:
        for task in [test_tasks.noop_task, test_tasks.noop_task_async]:
            with self.subTest(task):
                result = await task.aenqueue()
                await arun_worker()
                await result.arefresh()

                self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
                self.assertIs(result.is_finished, True)
                self.assertIsNotNone(result.started_at)
                self.assertIsNotNone(result.last_attempted_at)
                self.assertIsNotNone(result.finished_at)
                self.assertGreaterEqual(result.started_at, result.enqueued_at)
                self.assertGreaterEqual(result.finished_at, result.started_at)
                self.assertIsNone(result.return_value)
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [])
                self.assertEqual(result.kwargs, {})
                self.assertEqual(result.attempts, 1)

    def test_catches_exception(self) -> None:
        test_data = [
            (test_tasks.failing_task_value_error, ValueError, "This Task failed due to ValueError"),
            (test_tasks.failing_task_system_exit, SystemExit, "This Task failed due to SystemExit"),
        ]
        for task, exception, message in test_data:
            with self.subTest(task):
                result = task.enqueue()
                with self.assertLogs("django.tasks", level="ERROR") as captured_logs:
                    run_worker()
                result.refresh()

                self.assertEqual(len(captured_logs.output), 1)
                self.assertIn(message, captured_logs.output[0])

                self.assertEqual(result.status, TaskResultStatus.FAILED)
                with self.assertRaisesMessage(ValueError, "Task failed"):
                    result.return_value  # noqa: B018
                self.assertIs(result.is_finished, True)
                self.assertIsNotNone(result.started_at)
                self.assertIsNotNone(result.last_attempted_at)
                self.assertIsNotNone(result.finished_at)
                self.assertGreaterEqual(result.started_at, result.enqueued_at)
                self.assertGreaterEqual(result.finished_at, result.started_at)
                self.assertEqual(result.errors[0].exception_class, exception)
                traceback = result.errors[0].traceback
                self.assertIs(
                    traceback and traceback.endswith(f"{exception.__name__}: {message}\n"), True, traceback
                )
                self.assertEqual(result.task, task)
                self.assertEqual(result.args, [])
                self.assertEqual(result.kwargs, {})

    def test_throws_keyboard_interrupt(self) -> None:
        result = default_task_backend.enqueue(test_tasks.failing_task_keyboard_interrupt, [], {})
        with self.assertRaises(KeyboardInterrupt), self.assertNoLogs("django.tasks", level="ERROR"):
            run_worker()
        result.refresh()
        self.assertIs(result.is_finished, False)

    def test_complex_exception(self) -> None:
        result = test_tasks.complex_exception.enqueue()
        with self.assertLogs("django.tasks", level="ERROR"):
            run_worker()
        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.FAILED)
        with self.assertRaisesMessage(ValueError, "Task failed"):
            result.return_value  # noqa: B018
        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)
        self.assertGreaterEqual(result.started_at, result.enqueued_at)
        self.assertGreaterEqual(result.finished_at, result.started_at)

        self.assertIsNone(result._return_value)
        self.assertEqual(result.errors[0].exception_class, ValueError)
        self.assertIn('ValueError(ValueError("This task failed"))', result.errors[0].traceback)

        self.assertEqual(result.task, test_tasks.complex_exception)
        self.assertEqual(result.args, [])
        self.assertEqual(result.kwargs, {})

    def test_complex_return_value(self) -> None:
        result = test_tasks.complex_return_value.enqueue()
        with self.assertLogs("django.tasks", level="ERROR"):
            run_worker()
        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.FAILED)
        self.assertIsNotNone(result.started_at)
        self.assertIsNotNone(result.last_attempted_at)
        self.assertIsNotNone(result.finished_at)
        self.assertGreaterEqual(result.started_at, result.enqueued_at)
        self.assertGreaterEqual(result.finished_at, result.started_at)
        self.assertIsNone(result._return_value)
        self.assertEqual(result.errors[0].exception_class, TypeError)
        self.assertIn("Unsupported type", result.errors[0].traceback)

    def test_result(self) -> None:
        result = default_task_backend.enqueue(test_tasks.calculate_meaning_of_life, [], {})
        run_worker()
        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, 42)

    async def test_result_async(self) -> None:
        result = await default_task_backend.aenqueue(test_tasks.calculate_meaning_of_life, [], {})
        await arun_worker()
        await result.arefresh()

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(result.return_value, 42)

    def test_run_after_delays_the_run(self) -> None:
        run_after = timezone.now() + timedelta(milliseconds=300)
        task = test_tasks.calculate_meaning_of_life.using(run_after=run_after)
        default_task_backend.validate_task(task)
        result = task.enqueue()
        self.assertEqual(default_task_backend.get_result(result.id).task.run_after, run_after)
        run_worker()  # waits for delayed runs due within its timeout
        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)
        self.assertGreaterEqual(result.started_at, run_after)

    def test_enqueue_logs(self) -> None:
        with self.assertLogs("django.tasks", level="DEBUG") as enqueue_logs:
            result = test_tasks.noop_task.enqueue()
        with self.assertLogs("django.tasks", level="DEBUG") as worker_logs:
            run_worker()

        self.assertEqual(len(enqueue_logs.output), 1)
        self.assertIn("enqueued", enqueue_logs.output[0])
        self.assertIn(result.id, enqueue_logs.output[0])

        self.assertEqual(len(worker_logs.output), 2)
        self.assertIn("state=RUNNING", worker_logs.output[0])
        self.assertIn(result.id, worker_logs.output[0])

        self.assertIn("state=SUCCESSFUL", worker_logs.output[1])
        self.assertIn(result.id, worker_logs.output[1])

    def test_failed_logs(self) -> None:
        with self.assertLogs("django.tasks", level="DEBUG") as enqueue_logs:
            result = test_tasks.failing_task_value_error.enqueue()
        with self.assertLogs("django.tasks", level="DEBUG") as worker_logs:
            run_worker()

        self.assertEqual(len(enqueue_logs.output), 1)
        self.assertEqual(len(worker_logs.output), 2)
        self.assertIn("state=RUNNING", worker_logs.output[0])
        self.assertIn(result.id, worker_logs.output[0])

        self.assertIn("state=FAILED", worker_logs.output[1])
        self.assertIn(result.id, worker_logs.output[1])

    def test_successful_task_no_none_in_logs(self) -> None:
        with self.assertLogs("django.tasks", level="DEBUG") as captured_logs:
            result = test_tasks.noop_task.enqueue()
            run_worker()
        result.refresh()

        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

        for log_output in captured_logs.output:
            self.assertNotIn("None", log_output)

    def test_takes_context(self) -> None:
        result = test_tasks.get_task_id.enqueue()
        run_worker()
        result.refresh()

        self.assertEqual(result.return_value, result.id)

    def test_context(self) -> None:
        result = test_tasks.test_context.enqueue(1)
        run_worker()
        result.refresh()
        self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

    # Django builds the task under QUEUES [] (validation off), which this backend cannot offer:
    # every queue must be a lane. The task is built with a queue valid now, enqueued under
    # settings where it is not.
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


class ImmediateBackendTransactionTestCase(CheckedRunRows, TransactionTestCase):
    @override_settings(TASKS=KUMIKO_TASKS)
    def test_waits_until_transaction_commit(self) -> None:
        with transaction.atomic():
            result = test_tasks.calculate_meaning_of_life.enqueue()

            self.assertIsNotNone(result.enqueued_at)
            self.assertEqual(result.status, TaskResultStatus.READY)
            self.assertEqual(run_worker(), {})  # recorded, not in Redis before the commit

        self.assertEqual(run_worker(), {"succeeded": 1})
        result.refresh()
        self.assertEqual(result.return_value, 42)

    @override_settings(TASKS=KUMIKO_TASKS)
    def test_rolled_back_enqueue_leaves_nothing(self) -> None:
        with self.assertNoLogs("django.tasks", level="DEBUG"), transaction.atomic():
            result = test_tasks.calculate_meaning_of_life.enqueue()
            transaction.set_rollback(True)

        self.assertFalse(JobRun.objects.filter(pk=result.id).exists())
        self.assertEqual(run_worker(), {})
