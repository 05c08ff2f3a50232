"""End to end: a job dispatched inside a transaction reaches the worker only if it commits."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_rolled_back_dispatch_never_runs_committed_one_does(
    start_worker: Any, wait_for_run: Any, traces: Any, redis_client: Any
) -> None:
    worker = start_worker("worker")
    with pytest.raises(RuntimeError, match="roll back"), transaction.atomic():
        rolled_back = dispatch("tests.record", {"n": "rolled back"})
        raise RuntimeError("roll back")
    with transaction.atomic():
        committed = dispatch("tests.record", {"n": "committed"})
    after = dispatch("tests.record", {"n": "after"})

    # Both later jobs ran, so the worker was alive and had every chance to see the first one.
    assert wait_for_run(committed.run_id).status == RunStatus.SUCCEEDED
    assert wait_for_run(after.run_id).status == RunStatus.SUCCEEDED

    assert [e["payload"]["n"] for e in traces("record")] == ["committed", "after"]
    assert {e["pid"] for e in traces("record")} == {worker.pid}
    assert not JobRun.objects.filter(pk=rolled_back.run_id).exists()
    assert JobRun.objects.count() == 2
    assert not redis_client.exists(get_keys().job(rolled_back.job_id))
