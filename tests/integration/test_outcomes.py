"""End to end: how attempts end (retry with backoff, unrecoverable, timeout, delay) on a real worker."""

from __future__ import annotations

import itertools
import time
import zlib
from typing import Any

import pytest
from django.db import connection, transaction

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from tests.integration.support import holds_for, in_started_registry, log_messages, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_flaky_job_is_retried_with_exponential_backoff_until_it_succeeds(
    start_worker: Any, wait_for_run: Any, traces: Any
) -> None:
    worker = start_worker("worker")
    result = dispatch("tests.flaky", {"succeed_on": 3})

    run = wait_for_run(result.run_id)

    attempts = traces("flaky")
    assert [(e["attempt"], e["final"]) for e in attempts] == [(1, False), (2, False), (3, True)]
    assert {e["pid"] for e in attempts} == {worker.pid}
    # Backoff("exponential", delay_ms=50): 50 ms after attempt 1, 100 ms after attempt 2; the
    # worker wakes for its own retries (not at its next once-a-second promotion round).
    first_gap, second_gap = (b["t"] - a["t"] for a, b in itertools.pairwise(attempts))
    assert 0.05 <= first_gap < 0.5
    assert 0.1 <= second_gap < 0.55
    assert (run.status, run.attempt, run.max_attempts, run.error) == (RunStatus.SUCCEEDED, 3, 3, "")
    assert log_messages(run, "error") == [
        "RuntimeError: flaky failure on attempt 1",
        "RuntimeError: flaky failure on attempt 2",
    ]


def test_flaky_job_that_never_succeeds_fails_after_its_last_attempt(
    start_worker: Any, wait_for_run: Any, traces: Any, redis_client: Any
) -> None:
    start_worker("worker")
    result = dispatch("tests.flaky", {})

    run = wait_for_run(result.run_id)

    assert [(e["attempt"], e["final"]) for e in traces("flaky")] == [(1, False), (2, False), (3, True)]
    assert (run.status, run.attempt) == (RunStatus.FAILED, 3)
    assert run.error == "RuntimeError: flaky failure on attempt 3"
    assert "Traceback" in run.traceback and "flaky failure on attempt 3" in run.traceback
    assert len(log_messages(run, "error")) == 3
    assert redis_client.zscore(get_keys().failed("worker"), result.job_id) is not None


def test_unrecoverable_error_fails_at_once_without_retries(
    start_worker: Any, wait_for_run: Any, traces: Any, redis_client: Any
) -> None:
    start_worker("worker")
    result = dispatch("tests.unrecoverable", {})

    run = wait_for_run(result.run_id)

    assert [e["attempt"] for e in traces("unrecoverable")] == [1]
    assert (run.status, run.attempt, run.max_attempts) == (RunStatus.FAILED, 1, 4)
    assert run.error == "UnrecoverableError: this cannot work"
    assert "raise UnrecoverableError" in run.traceback
    assert run.finished_at is not None
    job = redis_client.hgetall(get_keys().job(result.job_id))
    assert job[b"status"] == b"failed"
    assert b"UnrecoverableError" in zlib.decompress(job[b"exc_info"])
    # Nothing left to run: no retry was scheduled behind the final failure.
    assert redis_client.zcard(get_keys().scheduled("worker")) == 0


def test_timeout_stops_every_attempt_and_the_worker_goes_on(
    start_worker: Any, wait_for_run: Any, traces: Any
) -> None:
    worker = start_worker("worker")
    slow = dispatch("tests.slow", {"seconds": 3})  # timeout=0.5, retries=1
    after = dispatch("tests.record", {"n": "after the slow one"})

    run = wait_for_run(slow.run_id)
    assert wait_for_run(after.run_id).status == RunStatus.SUCCEEDED

    assert [e["attempt"] for e in traces("slow_start")] == [1, 2]
    assert traces("slow_end") == []
    assert (run.status, run.attempt) == (RunStatus.FAILED, 2)
    assert "exceeded its timeout of 0.5s" in run.error
    assert run.finished_at is not None and run.started_at is not None
    # Stopped at the timeout, not when the 3 s sleep would have ended.
    assert (run.finished_at - run.started_at).total_seconds() < 2
    [record] = traces("record")
    assert (record["payload"], record["pid"]) == ({"n": "after the slow one"}, worker.pid)
    assert worker.proc.poll() is None


def test_delayed_dispatch_runs_no_earlier_than_its_delay(
    start_worker: Any, wait_for_run: Any, traces: Any, redis_client: Any
) -> None:
    start_worker("worker")
    dispatched_at = time.time()
    result = dispatch("tests.record", {"n": "later"}, delay=0.3)
    assert redis_client.zscore(get_keys().scheduled("worker"), result.job_id) is not None

    run = wait_for_run(result.run_id)

    [entry] = traces("record")
    assert 0.3 <= entry["t"] - dispatched_at < 2.5
    assert run.status == RunStatus.SUCCEEDED
    assert run.started_at is not None and (run.started_at - run.queued_at).total_seconds() >= 0.3


def test_every_run_record_names_its_worker_and_start_even_when_the_worker_wins_the_race(
    start_worker: Any, wait_for_run: Any
) -> None:
    """Outside a transaction dispatch() pushes first and inserts the queued row second, so a
    fast worker often starts the run before (or while) that row lands."""
    worker_name = f"{get_keys().prefix}-worker-1"
    start_worker("worker")
    for n in range(30):
        run = wait_for_run(dispatch("tests.record", {"n": n}).run_id)
        assert (run.status, run.worker) == (RunStatus.SUCCEEDED, worker_name), n
        assert run.started_at is not None and run.finished_at is not None, n
        assert run.queued_at <= run.started_at <= run.finished_at, n


def test_wait_for_run_returns_once_redis_has_heard_how_the_run_ended(
    start_worker: Any, wait_for_run: Any, wait_for_traces: Any, redis_client: Any
) -> None:
    start_worker("worker")
    result = dispatch("tests.sleeper", {"seconds": 0.5})
    wait_for_traces("sleeper_start")
    running = JobRun.objects.get(pk=result.run_id)
    # What wait_for_run waits out: the started registry holds a claimed job until its lane step.
    assert in_started_registry(redis_client, running)

    run = wait_for_run(result.run_id)

    assert run.status == RunStatus.SUCCEEDED
    assert not in_started_registry(redis_client, run)


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="a row lock held across the worker's write (PostgreSQL)"
)
def test_runs_keep_their_leases_while_a_success_write_waits(
    start_worker: Any, wait_for_run: Any, redis_client: Any, traces: Any
) -> None:
    """A worker's writer writes a success before Redis hears of it, for as long as the write
    takes: a row lock here, a database outage in the chaos test. Meanwhile the leases of that run
    and of any run claimed for the worker must be renewed, or another worker's reaper takes them
    for abandoned and runs them again."""
    first = dispatch("tests.record", {"n": 1})
    second = dispatch("tests.record", {"n": 2})
    started_key = get_keys().started("worker")

    def second_runs() -> int:
        return sum(t["payload"]["n"] == 2 for t in traces("record"))

    with transaction.atomic():
        # The first run's success UPDATE waits for this lock.
        JobRun.objects.select_for_update().get(pk=first.run_id)
        timings = {"KUMIKO_TEST_ABANDON_AFTER": "2", "KUMIKO_TEST_HEARTBEAT_INTERVAL": "0.5"}
        start_worker("worker", env=timings)
        wait_until(lambda: traces("record"), 10, "the first run to run")

        def leases_ahead() -> bool:
            leases = redis_client.zrange(started_key, 0, -1, withscores=True)
            return bool(leases) and all(deadline > time.time() for _member, deadline in leases)

        # Twice ABANDON_AFTER. Before (session 15), a one-thread worker's lease of the run it
        # claimed, or had just run, passed its deadline 2 s later.
        assert holds_for(leases_ahead, 4), redis_client.zrange(started_key, 0, -1, withscores=True)
        # The held success keeps its job out: nothing more is claimed for the one thread.
        assert second_runs() == 0
    for run_id in (first.run_id, second.run_id):
        run = wait_for_run(run_id)
        assert (run.status, run.attempt) == (RunStatus.SUCCEEDED, 1)
    assert second_runs() == 1
