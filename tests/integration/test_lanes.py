"""End to end: a worker consumes exactly its lane; jobs of the other lane wait for their worker."""

from __future__ import annotations

from typing import Any

import pytest

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from tests.integration.support import holds_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_api_job_runs_only_on_an_api_worker(
    start_worker: Any, wait_for_run: Any, traces: Any, redis_client: Any
) -> None:
    lane_worker = start_worker("worker")
    api_job = dispatch("tests.api_record", {"n": "api"})
    worker_job = dispatch("tests.record", {"n": "worker"})

    # The worker-lane job, dispatched after the api job, is done: the worker was free to take
    # the api job and did not.
    assert wait_for_run(worker_job.run_id).status == RunStatus.SUCCEEDED
    [record] = traces("record")
    assert (record["pid"], record["lane"]) == (lane_worker.pid, "worker")

    def api_job_waits() -> bool:
        status = JobRun.objects.filter(pk=api_job.run_id).values_list("status", flat=True).first()
        return status == RunStatus.QUEUED and not traces("api_record")

    assert holds_for(api_job_waits, seconds=1.5)
    assert redis_client.hget(get_keys().job(api_job.job_id), "status") == b"queued"

    api_worker = start_worker("api")
    run = wait_for_run(api_job.run_id)

    assert run.status == RunStatus.SUCCEEDED
    [entry] = traces("api_record")
    assert (entry["pid"], entry["lane"], entry["payload"]) == (api_worker.pid, "api", {"n": "api"})
    assert run.worker == f"{get_keys().prefix}-api-2"
    assert len(traces("record")) == 1
