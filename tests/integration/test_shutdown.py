"""End to end: stopping workers (SIGTERM, SIGKILL, --max-jobs, --burst) loses no job."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from django.db import connection, transaction

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from tests.integration.support import holds_for, in_started_registry, log_messages, logged_at, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_sigterm_lets_the_running_job_finish_and_starts_no_other(
    start_worker: Any, wait_for_run: Any, wait_for_traces: Any, traces: Any, redis_client: Any
) -> None:
    worker = start_worker("worker")
    running = dispatch("tests.sleeper", {"seconds": 2})
    waiting = dispatch("tests.record", {"n": "after sigterm"})
    [start] = wait_for_traces("sleeper_start")

    worker.signal(signal.SIGTERM)

    assert worker.wait(timeout=15) == 0
    [end] = traces("sleeper_end")
    assert end["t"] - start["t"] >= 2
    assert JobRun.objects.get(pk=running.run_id).status == RunStatus.SUCCEEDED
    # The job queued behind it was not started, and it is still queued for the next worker.
    assert traces("record") == []
    assert JobRun.objects.get(pk=waiting.run_id).status == RunStatus.QUEUED
    assert redis_client.hget(get_keys().job(waiting.job_id), "status") == b"queued"
    assert "SIGTERM received: finishing the running job, then stopping" in worker.output()

    successor = start_worker("worker")
    assert wait_for_run(waiting.run_id).status == RunStatus.SUCCEEDED
    assert traces("record")[0]["pid"] == successor.pid
    # An idle worker stops at once (it is blocked waiting for work) and unregisters.
    successor.signal(signal.SIGTERM)
    assert successor.wait(timeout=5) == 0
    assert f"rq:worker:{get_keys().prefix}-worker-2".encode() not in redis_client.smembers("rq:workers")


def test_job_of_a_killed_worker_is_run_again_by_another_within_a_minute(
    start_worker: Any, wait_for_run: Any, wait_for_traces: Any, traces: Any
) -> None:
    """Default timings (ABANDON_AFTER=30 s): the reaper of a live worker hands the run on."""
    first = start_worker("worker")
    result = dispatch("tests.hang_first", {"seconds": 120})  # retries=0
    wait_for_traces("hang_first_start")
    # A run that lasts is marked running (after RUNNING_MARK_DELAY, 0.2 s).
    wait_for_run(result.run_id, statuses=("running",), timeout=5)

    first.kill_group()
    killed_at = time.time()
    second = start_worker("worker")
    run = wait_for_run(result.run_id, timeout=60)

    starts = traces("hang_first_start")
    assert [(e["pid"], e["attempt"]) for e in starts] == [(first.pid, 1), (second.pid, 2)]
    assert starts[1]["t"] - killed_at < 60
    assert [e["pid"] for e in traces("hang_first_end")] == [second.pid]
    # A retry-less job gets one extra attempt after an abandonment (ABANDONED_RETRIES).
    assert (run.status, run.attempt, run.worker) == (RunStatus.SUCCEEDED, 2, f"{get_keys().prefix}-worker-2")
    [abandoned] = log_messages(run, "error")
    assert abandoned.startswith("AbandonedJob: the worker running attempt 1 stopped heartbeating")
    # The reaper put the run back in the queue (a retry), where the live worker took it.
    assert f"reaped abandoned job {result.job_id} (tests.hang_first): retried" in second.output()


def test_a_live_long_job_keeps_its_lease_and_is_not_run_twice(
    start_worker: Any, wait_for_run: Any, wait_for_traces: Any, traces: Any
) -> None:
    """Short timings: a job running for twice ABANDON_AFTER is kept alive by heartbeats."""
    fast = {"KUMIKO_TEST_ABANDON_AFTER": "2", "KUMIKO_TEST_HEARTBEAT_INTERVAL": "0.5"}
    workers = {start_worker("worker", env=fast).pid for _ in range(2)}  # one runs it, one reaps
    # Long enough that the idle worker reaps (every 5 s) after the 2 s lease would have expired.
    result = dispatch("tests.sleeper", {"seconds": 8})

    run = wait_for_run(result.run_id, timeout=20)

    [start] = traces("sleeper_start")
    assert (start["pid"] in workers, start["attempt"]) == (True, 1)
    assert (run.status, run.attempt, log_messages(run, "error")) == (RunStatus.SUCCEEDED, 1, [])


def test_max_jobs_exits_after_that_many_jobs(start_worker: Any, traces: Any, redis_client: Any) -> None:
    results = [dispatch("tests.record", {"n": n}) for n in range(3)]

    worker = start_worker("worker", "--max-jobs", "2", wait=False)

    assert worker.wait(timeout=30) == 0
    assert [e["payload"]["n"] for e in traces("record")] == [0, 1]
    statuses = [JobRun.objects.get(pk=r.run_id).status for r in results]
    assert statuses == [RunStatus.SUCCEEDED, RunStatus.SUCCEEDED, RunStatus.QUEUED]
    assert redis_client.hget(get_keys().job(results[2].job_id), "status") == b"queued"
    assert "stopped after 2 jobs" in worker.output()


def test_burst_exits_when_nothing_is_queued_or_due(start_worker: Any, traces: Any, redis_client: Any) -> None:
    now = [dispatch("tests.record", {"n": n}) for n in range(2)]
    later = dispatch("tests.record", {"n": "later"}, delay=600)

    worker = start_worker("worker", "--burst", wait=False)

    assert worker.wait(timeout=30) == 0
    assert sorted(e["payload"]["n"] for e in traces("record")) == [0, 1]
    assert [JobRun.objects.get(pk=r.run_id).status for r in now] == [RunStatus.SUCCEEDED] * 2
    assert JobRun.objects.get(pk=later.run_id).status == RunStatus.QUEUED
    assert redis_client.zscore(get_keys().scheduled("worker"), later.job_id) is not None


def test_idle_workers_stop_at_once_not_after_their_wait_for_work(
    start_worker: Any, redis_client: Any
) -> None:
    """An idle worker waits for work on Redis (a BLPOP of up to MAX_BLOCK, 1 s); a stop wakes
    that wait instead of waiting it out."""
    from kumiko_jobs.claiming import MAX_BLOCK

    # --no-scheduler: the promotion round would cut the wait short (it ends at the next one).
    args = [(), (), ("--threads", "4"), ("--threads", "4")]
    workers = [start_worker("worker", "--no-scheduler", *a) for a in args]
    # One token each on the lane's wake list (this test's prefix: only these workers take them):
    # each looks for work, finds none and starts a fresh wait of MAX_BLOCK, so without the
    # stop's wake each would stop about 1 s later. (Counting the server's blocked clients, as
    # this test once did, failed beside other test processes' workers.)
    redis_client.rpush(get_keys().wake("worker"), *["1"] * len(workers))
    wait_until(lambda: redis_client.llen(get_keys().wake("worker")) == 0, timeout=10)
    time.sleep(0.1)  # a look for work takes milliseconds: each waits again, most of MAX_BLOCK left

    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=10) == 0
        # By the worker's own clock, from the signal to its last line (the interpreter's exit
        # after it, ~0.3 s here, is not the worker's doing).
        received, stopped = (
            _logged_at(worker.output(), marker)
            for marker in ("SIGTERM received: no job running", "stopped after 0 jobs")
        )
        # Without the wake it would be most of a fresh MAX_BLOCK (the tokens above restarted it).
        assert stopped - received < 0.8 * MAX_BLOCK, worker.output()


def _logged_at(output: str, marker: str) -> float:
    [line] = [line for line in output.splitlines() if marker in line]
    return logged_at(line).timestamp()


def cold_stop(worker: Any) -> None:
    """SIGTERM, then a second one: RQ ignores a second signal within 1 s of the first."""
    worker.signal(signal.SIGTERM)
    time.sleep(2)  # a second past RQ's window: its first handler may run late on a busy machine
    worker.signal(signal.SIGTERM)


postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="a row lock held across the worker's write (PostgreSQL)"
)


@postgresql_only
def test_a_cold_stop_cuts_off_the_running_jobs_not_those_that_ended(
    start_worker: Any, wait_for_traces: Any, traces: Any, redis_client: Any
) -> None:
    """A second signal while a job runs: the success another thread handed over is still
    written and Redis told before the worker exits (else it would be run again)."""
    ended = dispatch("tests.record", {"n": 1})
    running = dispatch("tests.sleeper", {"seconds": 60})
    with transaction.atomic():
        # The ended run's success UPDATE waits for this lock, in the writer.
        JobRun.objects.select_for_update().get(pk=ended.run_id)
        worker = start_worker("worker", "--threads", "2")
        wait_for_traces("record")
        wait_for_traces("sleeper_start")
        cold_stop(worker)
        wait_until(lambda: "cold shut down" in worker.output(), 5, "the cold stop")
        # It waits for the write, not for the job it cut off.
        assert holds_for(lambda: worker.proc.poll() is None, 1)
    assert worker.wait(timeout=10) == 0
    run = JobRun.objects.get(pk=ended.run_id)
    assert (run.status, run.attempt) == (RunStatus.SUCCEEDED, 1)
    # Told: out of the started registry. The cut-off run keeps its lease there for a reaper.
    cut_off = JobRun.objects.get(pk=running.run_id)
    assert not in_started_registry(redis_client, run)
    assert in_started_registry(redis_client, cut_off)
    assert traces("sleeper_end") == []
    assert "whose write has not returned" not in worker.output()


@postgresql_only
def test_a_cold_stop_while_the_writes_wait_stops_at_once_and_loses_nothing(
    start_worker: Any, wait_for_run: Any, traces: Any, redis_client: Any
) -> None:
    """A second signal while the worker waits for its last writes (a row lock here, a database
    outage in production) stops it at once, as it says. The run's lease expires and the next
    worker's reaper settles it by its record: here the UPDATE was sent and commits once the lock
    goes, so the run counts as succeeded and is not run again."""
    first = dispatch("tests.record", {"n": 1})
    fast = {"KUMIKO_TEST_ABANDON_AFTER": "2", "KUMIKO_TEST_HEARTBEAT_INTERVAL": "0.5"}
    with transaction.atomic():
        JobRun.objects.select_for_update().get(pk=first.run_id)
        worker = start_worker("worker", env=fast)
        wait_until(lambda: traces("record"), 10, "the run to run")
        cold_stop(worker)
        assert worker.wait(timeout=5) == 0
        assert in_started_registry(redis_client, JobRun.objects.get(pk=first.run_id))
    assert "stopping with 1 success(es) whose write has not returned" in worker.output()

    successor = start_worker("worker", env=fast)
    run = wait_for_run(first.run_id, timeout=20)
    assert (run.status, run.attempt) == (RunStatus.SUCCEEDED, 1)
    assert [t["attempt"] for t in traces("record")] == [1]
    # Logged just after the reap script that settled the run in Redis, which wait_for_run saw.
    reaped = f"reaped abandoned job {first.job_id} (tests.record): succeeded"
    wait_until(lambda: reaped in successor.output(), 5, "the reaper's line")
