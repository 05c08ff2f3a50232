"""pytest fixtures for projects that use kumiko_jobs.

Enable with ``pytest_plugins = ["kumiko_jobs.pytest_plugin"]`` in your ``conftest.py``. They need
pytest-django and a real Redis (``KUMIKO_REDIS_URL``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kumiko_jobs.testing import drain, isolated_prefix


@pytest.fixture
def kumiko_prefix() -> Iterator[str]:
    """A private QUEUE_PREFIX for the test; its Redis keys are deleted afterwards."""
    with isolated_prefix() as prefix:
        yield prefix


@pytest.fixture
def run_jobs(kumiko_prefix: str, transactional_db: None) -> Callable[..., dict[str, int]]:
    """``run_jobs()`` runs every job the test dispatched (see ``kumiko_jobs.testing.drain``)."""
    return drain
