"""The Django ``@task`` the benchmarks enqueue (bench/tasks.py): it does nothing, so the enqueue
path is what is measured."""

from __future__ import annotations

from django.tasks import task


@task()
def noop(i: int) -> None:
    return None
