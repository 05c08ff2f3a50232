"""A Redis that answers but refuses writes: a replica after a failover (READONLY), here a private
redis-server that replicates from a primary that is not there. Dispatch raises QueueUnavailable
and leaves no row; inside ``atomic()`` nothing is raised into the caller and the committed row
waits for the outbox."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.db import transaction

from kumiko_jobs import QueueUnavailable, dispatch, pushing
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from tests.integration.redis_servers import RedisServer, free_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def replica_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port, absent_primary = free_port(), free_port()
    config = f"port {port}\nreplicaof 127.0.0.1 {absent_primary}\nreplica-read-only yes\n"
    server = RedisServer(tmp_path_factory.mktemp("redis-replica"), config)
    try:
        server.wait_ready(redis.Redis(host="127.0.0.1", port=port))
        with pytest.raises(redis.ReadOnlyError):  # the refusal this module is about
            redis.Redis(host="127.0.0.1", port=port).set("k", "v")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.stop()


@pytest.fixture
def on_replica(settings: Any, replica_url: str) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "REDIS_URL": None, "REDIS": replica_url}


@pytest.mark.usefixtures("on_replica")
def test_a_refused_push_raises_queue_unavailable_and_leaves_no_row(monkeypatch: pytest.MonkeyPatch) -> None:
    # Refused where the lane's queue is listed in rq:queues (the first push of a process)...
    with pytest.raises(
        QueueUnavailable, match=r"refused the push \(You can't write against a read only replica"
    ):
        dispatch("tests.record", {"n": 1})
    assert not JobRun.objects.exists()
    # ... and by the enqueue script itself, once the queue counts as listed: the row that went
    # to the database while Redis worked is taken back.
    monkeypatch.setattr(pushing, "_registered_queues", {get_keys().queue("worker")})
    with pytest.raises(
        QueueUnavailable, match=r"read only replica.*point KUMIKO_JOBS\['REDIS'\] at the primary"
    ):
        dispatch("tests.record", {"n": 2})
    with pytest.raises(QueueUnavailable, match="read only replica"):
        dispatch("tests.record", {"n": 3}, delay=60)
    assert not JobRun.objects.exists()


@pytest.mark.usefixtures("on_replica")
def test_a_refused_push_at_commit_raises_nothing_into_the_caller() -> None:
    later: list[str] = []
    with transaction.atomic():
        result = dispatch("tests.record", {"n": 3})
        transaction.on_commit(lambda: later.append("ran"))
    # The caller's own callback after the dispatch still ran, and the run waits, committed and
    # unpushed, for the outbox (rebuild.push_waiting) to push it once Redis takes writes.
    assert later == ["ran"]
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.pushed_at) == (RunStatus.QUEUED, None)
