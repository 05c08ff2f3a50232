"""kumiko_jobs.testing's clean-up: a test's prefix leaves nothing in Redis, RQ's global sets included."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys
from kumiko_jobs.keys import RQ_QUEUES, RQ_WORKERS, Keys
from kumiko_jobs.testing import forget_prefix, isolated_prefix


@pytest.mark.django_db(transaction=True)
def test_forget_prefix_takes_the_prefix_out_of_rqs_global_sets(redis_client: redis.Redis) -> None:
    with isolated_prefix() as prefix:
        dispatch("tests.record", {"n": 1})
        queue = get_keys().queue("worker")
        assert redis_client.sismember(RQ_QUEUES, queue)
        # What a killed supervisor's child leaves: it never unregisters.
        redis_client.sadd(RQ_WORKERS, Keys.worker(f"{prefix}-worker-1-p2"))
        redis_client.sadd(RQ_WORKERS, Keys.worker("someone-else"))
    try:
        assert not list(redis_client.scan_iter(match=f"*{prefix}*"))
        # The prefix has a "-", so its jobs' hashes are named by the sanitised id tag.
        assert Keys(prefix).id_tag != prefix
        assert not list(redis_client.scan_iter(match=f"*{Keys(prefix).id_tag}*"))
        assert not redis_client.sismember(RQ_QUEUES, queue)
        assert not redis_client.sismember(RQ_WORKERS, Keys.worker(f"{prefix}-worker-1-p2"))
        assert redis_client.sismember(RQ_WORKERS, Keys.worker("someone-else"))
    finally:
        redis_client.srem(RQ_WORKERS, Keys.worker("someone-else"))


@pytest.mark.django_db(transaction=True)
def test_a_prefix_used_again_lists_its_queue_again(redis_client: redis.Redis) -> None:
    with isolated_prefix() as prefix:
        dispatch("tests.record", {"n": 1})
        forget_prefix(redis_client, prefix)
        # This process remembered listing the queue; forgetting the prefix forgets that too.
        dispatch("tests.record", {"n": 2})
        assert redis_client.sismember(RQ_QUEUES, get_keys().queue("worker"))


def test_a_prefix_with_glob_characters_forgets_only_its_own_keys(redis_client: redis.Redis) -> None:
    other = f"{uuid.uuid4().hex[:8]}-other"
    redis_client.set(other, 1)
    try:
        forget_prefix(redis_client, "*")
        forget_prefix(redis_client, "[a-z0-9]")
        assert redis_client.exists(other)
    finally:
        redis_client.delete(other)


def test_forget_prefix_leaves_prefixes_that_only_contain_it(redis_client: redis.Redis) -> None:
    """A substring match took "myshop:..." and "rq:queue:shop2:worker" with "shop"."""
    base = f"p{uuid.uuid4().hex[:8]}"
    neighbours = [f"my{base}:epoch", f"rq:queue:{base}2:worker", f"rq:job:{base}2-0123"]
    own = [f"{base}:epoch", f"rq:queue:{base}:worker", f"rq:job:{Keys(base).id_tag}-0123"]
    for key in (*neighbours, *own):
        redis_client.set(key, 1)
    try:
        forget_prefix(redis_client, base)
        assert [bool(redis_client.exists(key)) for key in neighbours] == [True, True, True]
        assert not any(redis_client.exists(key) for key in own)
    finally:
        redis_client.delete(*neighbours, *own)


@pytest.mark.django_db
def test_drain_inside_a_tests_transaction_keeps_the_tests_data(
    django_capture_on_commit_callbacks: Any, tenants: list[Any]
) -> None:
    """The worker's clean-up after a job closed the connection because it was inside a
    transaction, the test's own: everything the test had written was rolled back."""
    from kumiko_jobs.models import JobRun
    from kumiko_jobs.testing import drain
    from project.demo.models import Tenant

    with django_capture_on_commit_callbacks(execute=True):
        result = dispatch("tests.record", {"n": 1}, tenant=tenants[0])
    assert drain() == {"succeeded": 1}
    assert Tenant.objects.filter(pk=tenants[0].pk).exists()  # the test's data is still there
    assert JobRun.objects.get(pk=result.run_id).status == "succeeded"


def _again(payload: dict[str, Any], ctx: Any) -> None:
    """Dispatches itself again, without end (a bug drain() must not hang on)."""
    ctx.dispatch("tests.again", {"n": int(payload["n"]) + 1})


@pytest.mark.django_db(transaction=True)
def test_drain_stops_a_job_that_dispatches_itself_at_its_timeout() -> None:
    import time

    from kumiko_jobs.models import JobRun, RunStatus
    from kumiko_jobs.registry import build_definition, registry
    from kumiko_jobs.testing import DrainTimeout, drain

    with registry.isolated():
        registry.register(build_definition(_again, "tests.again", {}))
        dispatch("tests.again", {"n": 0})
        started = time.monotonic()
        with pytest.raises(DrainTimeout, match=r"after its limit of 0.3s .*dispatches itself"):
            drain(timeout=0.1, limit=0.3)
        assert time.monotonic() - started < 5
        # The run it claimed last went back to its flow, unstarted: the next drain takes it.
        [waiting] = JobRun.objects.filter(job_name="tests.again", status=RunStatus.QUEUED)
        with pytest.raises(DrainTimeout):
            drain(limit=0.1)
        assert JobRun.objects.get(pk=waiting.pk).status == RunStatus.SUCCEEDED


@pytest.mark.django_db(transaction=True)
def test_drain_says_which_runs_it_left_scheduled_past_its_timeout(caplog: pytest.LogCaptureFixture) -> None:
    from kumiko_jobs.testing import drain

    dispatch("tests.defer", {"times": 1, "ms": 60_000})
    drained = drain(timeout=0.2)
    assert drained == {"deferred": 1}  # still a plain dict to compare
    assert drained.waiting == 1
    said = [r.getMessage() for r in caplog.records if "still scheduled" in r.getMessage()]
    assert said == [
        "kumiko_jobs: drain() returned with 1 run(s) still scheduled after its timeout of 0.2s "
        "(retries, deferrals or delayed dispatches due later); they did not run"
    ]
    assert drain(timeout=0.05).waiting == 1


@pytest.mark.django_db(transaction=True)
def test_a_short_timeout_still_runs_the_ready_jobs() -> None:
    """``timeout`` is how long to wait for delayed runs; ready ones run whatever it says."""
    from kumiko_jobs.testing import drain

    for n in range(3):
        dispatch("tests.record", {"n": n})
    assert drain(timeout=0) == {"succeeded": 3}
