"""A task module nothing imports at start-up (not named ``tasks``): a process that meets one of
its runs imports it by the task's name (tests/test_backends.py)."""

from __future__ import annotations

from django.tasks import task


@task(queue_name="api")
def lazy(n: int) -> int:
    return n + 1


def not_a_task() -> None:
    return None
