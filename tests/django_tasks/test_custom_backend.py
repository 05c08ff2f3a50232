"""Django 6.1.3 ``tests/tasks/test_custom_backend.py`` against KumikoTaskBackend.

Django's file tests a backend written in the test file (``CustomBackend``) and a ``task_class``
(``CustomTask``). KumikoTaskBackend is such a backend, and ``KumikoTask`` such a task class (it
carries kumiko's options), so the cases run against them.

Not applicable, with the reason:

- ``test_options``: it checks that the test file's own ``CustomBackend.enqueue`` logs its
  OPTIONS prefix. KumikoTaskBackend has no OPTIONS (the check E505 refuses them, see
  tests/test_backends.py).
- ``test_no_enqueue``: it checks Python's abstract-method error for a backend without
  ``enqueue``; KumikoTaskBackend implements it (``test_backend_is_constructible`` instead).
- ``test_backend_does_not_support_priority`` as written needs ``supports_priority = False``;
  it runs with the flag patched off, which checks that the backend keeps Django's validation.
"""

from __future__ import annotations

from unittest import mock

from django.tasks import Task, default_task_backend, task, task_backends
from django.tasks.exceptions import InvalidTask
from django.test import SimpleTestCase, override_settings

from kumiko_jobs import MaxPerTenant
from kumiko_jobs.backends import KumikoTaskBackend
from kumiko_jobs.task_class import KumikoTask
from tests.django_tasks.support import BACKEND, KUMIKO_TASKS
from tests.testapp import tasks as test_tasks


@override_settings(TASKS={**KUMIKO_TASKS, "second": {"BACKEND": BACKEND}})
class CustomBackendTestCase(SimpleTestCase):
    def test_using_correct_backend(self) -> None:
        self.assertEqual(default_task_backend, task_backends["default"])
        self.assertIsInstance(task_backends["default"], KumikoTaskBackend)
        self.assertEqual(default_task_backend.alias, "default")
        self.assertEqual(default_task_backend.options, {})

    @mock.patch.multiple(KumikoTaskBackend, supports_async_task=False)
    def test_enqueue_async_task_on_non_async_backend(self) -> None:
        with self.assertRaisesMessage(InvalidTask, "Backend does not support async Tasks."):
            default_task_backend.validate_task(test_tasks.noop_task_async)

    @mock.patch.multiple(KumikoTaskBackend, supports_priority=False)
    def test_backend_does_not_support_priority(self) -> None:
        with self.assertRaisesMessage(InvalidTask, "Backend does not support setting priority of tasks."):
            test_tasks.noop_task.using(priority=10)

    def test_backend_is_constructible(self) -> None:
        self.assertIsInstance(test_tasks.noop_task.using(backend="second").get_backend(), KumikoTaskBackend)


@override_settings(TASKS=KUMIKO_TASKS)
class CustomTaskTestCase(SimpleTestCase):
    def test_custom_task_default_values(self) -> None:
        my_task = task()(test_tasks.noop_task.func)

        self.assertIsInstance(my_task, KumikoTask)
        self.assertIsInstance(my_task, Task)
        self.assertEqual(my_task.retries, 0)
        self.assertIsNone(my_task.backoff)
        self.assertIsNone(my_task.timeout)
        self.assertIsNone(my_task.max_per_tenant)

    def test_custom_task_with_custom_values(self) -> None:
        my_task = task(retries=3, timeout=5)(test_tasks.noop_task.func)

        self.assertIsInstance(my_task, KumikoTask)
        self.assertEqual(my_task.retries, 3)
        self.assertEqual(my_task.timeout, 5)

    def test_custom_task_with_standard_and_custom_values(self) -> None:
        cap = MaxPerTenant(2, on_limit="defer")
        my_task = task(priority=10, queue_name="api", retries=1, max_per_tenant=cap)(
            test_tasks.noop_task.func
        )

        self.assertIsInstance(my_task, KumikoTask)
        self.assertEqual(my_task.priority, 10)
        self.assertEqual(my_task.queue_name, "api")
        self.assertEqual(my_task.retries, 1)
        self.assertEqual(my_task.max_per_tenant, cap)
        self.assertFalse(my_task.takes_context)
        self.assertIsNone(my_task.run_after)

    def test_custom_task_invalid_kwarg(self) -> None:
        with self.assertRaises(TypeError):
            task(unknown_param=123)(test_tasks.noop_task.func)
