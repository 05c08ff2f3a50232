"""The intake of a --threads worker (claiming.py, job_threads.py): a claimer thread makes the job
threads' lane steps and keeps a few claimed jobs ready; on real Redis, a real database and real
threads, in this process."""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from typing import Any

import pytest

from kumiko_jobs import dispatch
from kumiko_jobs.claiming import PREFETCH_PER_THREAD, PREFETCH_WAIT, Claimer
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.lane import Finished
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.outcomes import Outcome, release_of
from kumiko_jobs.testing import drain
from kumiko_jobs.worker import LaneWorker
from tests.integration.support import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker() -> LaneWorker:
    """A worker of the lane that is not working: its claimer is driven by the test."""
    return LaneWorker("worker", threads=4)


def test_threads_run_every_run_once_and_the_claimer_batches_their_steps(
    tenants: list[Any], traces: Any
) -> None:
    runs = [dispatch("tests.record", {"n": n}, tenant=tenants[n % 3]) for n in range(60)]
    worker = LaneWorker("worker", threads=4)
    worker.work(burst=True, logging_level="WARNING")
    assert sorted(e["payload"]["n"] for e in traces("record")) == list(range(60))
    assert {JobRun.objects.get(pk=r.run_id).status for r in runs} == {RunStatus.SUCCEEDED}
    assert worker.counts == {"succeeded": 60}
    keys = get_keys()
    assert get_redis().zcard(keys.started("worker")) == 0  # every lease finished
    assert not any(get_redis().exists(keys.job(r.job_id)) for r in runs)  # RESULT_TTL 0
    batching = re.fullmatch(
        r"(\d+) lane steps in (\d+) script calls .*; (\d+) successes written in (\d+) batches",
        worker.batching,
    )
    assert batching is not None, worker.batching
    carried, calls, written, writes = (int(n) for n in batching.groups())
    assert carried >= 120 and calls < carried  # 60 claims and 60 finishes, several a call
    assert written == 60 and writes <= 60


def test_prefetch_follows_the_pace_at_most_four_jobs_a_thread(worker: LaneWorker) -> None:
    claimer = Claimer(worker, 8, burst=True)
    assert claimer._want() == 0  # nothing waits, no pace yet: nothing claimed ahead
    now = time.monotonic()
    # Eight 1 s jobs a second on 8 threads: a job claimed ahead would wait about 1 s.
    claimer._pace.ended(8, now - 1.0)
    claimer._pace.ended(8, now)
    assert claimer._want() == 0
    # About 400 jobs a second (20 ms jobs on 8 threads): what they finish in PREFETCH_WAIT.
    fast = Claimer(worker, 8, burst=True)
    fast._pace.ended(32, now - 32 / 475)
    assert fast._want() == int(475 * PREFETCH_WAIT) == 9
    fast._waiting = 2  # plus one for each waiting thread
    assert fast._want() == 11
    # Trivial jobs: never more than PREFETCH_PER_THREAD a thread ahead.
    fast._pace.ended(32, now)
    fast._waiting = 0
    assert fast._want() == PREFETCH_PER_THREAD * 8 == 32


def test_a_stopping_claimer_gives_its_ready_jobs_back_untouched(
    worker: LaneWorker, tenants: list[Any], traces: Any
) -> None:
    tenant = str(tenants[0].pk)
    runs = [dispatch("tests.record", {"n": n}, tenant=tenant) for n in range(6)]
    client, keys = get_redis(), get_keys()
    claimer = Claimer(worker, 4, burst=False)
    claimer._pace.ended(16, time.monotonic())  # a fast pace: four jobs ready for each thread
    claimer.start()
    try:
        # Claimed in Redis, and their leases renewed meanwhile: the claimer holds them once the
        # step's reply is back, a moment after Redis counts them (so both are waited for).
        wait_until(
            lambda: client.zcard(keys.started("worker")) == 6 and len(worker.leases._members) == 6,
            10,
            "every run claimed ahead, its lease held",
        )
        worker._stop_requested = True  # SIGTERM
        assert claimer.take() is None  # no job starts after a stop
        # Back in Redis first, then the leases are let go.
        wait_until(
            lambda: client.zcard(keys.started("worker")) == 0 and not worker.leases._members,
            10,
            "the ready jobs given back",
        )
    finally:
        claimer.close()
        claimer.join(10)
    assert not claimer.is_alive()
    # Never started: records untouched, no attempt used, and back in their order.
    assert {(r.status, r.attempt, r.started_at) for r in JobRun.objects.all()} == {
        (RunStatus.QUEUED, 1, None)
    }
    assert drain() == {"succeeded": 6}
    assert [e["payload"]["n"] for e in traces("record")] == list(range(6))
    assert [JobRun.objects.get(pk=r.run_id).attempt for r in runs] == [1] * 6


def test_jobs_claimed_ahead_that_no_thread_takes_go_back_to_their_flows(
    worker: LaneWorker, tenants: list[Any], traces: Any
) -> None:
    """Claimed ahead at a fast pace, then every thread went on to a long job: after HOLD_READY
    the ready jobs go back to the front of their flows (another worker may run them now), not
    held with their leases and cap slots until the long jobs end."""
    from kumiko_jobs.claiming import HOLD_READY

    tenant = str(tenants[0].pk)
    runs = [dispatch("tests.record", {"n": n}, tenant=tenant) for n in range(6)]
    client, keys = get_redis(), get_keys()
    claimer = Claimer(worker, 4, burst=False)
    claimer._pace.ended(16, time.monotonic())  # a fast pace: jobs claimed ahead
    claimer.start()
    try:
        wait_until(lambda: len(worker.leases._members) == 6, 10, "every run claimed ahead, held")
        claimed_at = time.monotonic()
        # No thread takes any (they are all busy): given back, leases let go, no stop needed.
        wait_until(
            lambda: client.zcard(keys.started("worker")) == 0 and not worker.leases._members,
            10,
            "the held jobs given back",
        )
        assert time.monotonic() - claimed_at >= HOLD_READY - 0.1
        assert claimer._ready == deque() and claimer.is_alive()
    finally:
        worker._stop_requested = True
        claimer.close()
        claimer.join(10)
    assert {(r.status, r.attempt, r.started_at) for r in JobRun.objects.all()} == {
        (RunStatus.QUEUED, 1, None)
    }
    assert drain() == {"succeeded": 6}
    assert [e["payload"]["n"] for e in traces("record")] == list(range(6))
    assert [JobRun.objects.get(pk=r.run_id).attempt for r in runs] == [1] * 6


def test_a_step_whose_answer_is_lost_is_sent_again_and_its_claims_are_kept(
    worker: LaneWorker, tenants: list[Any], traces: Any
) -> None:
    """Redis ran the claimer's step, and its answer was lost (script_calls' own resend failed
    too): the step is sent again with the same execution ids and returns the jobs it claimed,
    instead of new claims that left those to the reaper (an attempt each)."""
    import redis as redis_module

    runs = [dispatch("tests.record", {"n": n}, tenant=str(tenants[0].pk)) for n in range(6)]
    client, keys = get_redis(), get_keys()
    claimer = Claimer(worker, 4, burst=False)
    claimer._pace.ended(16, time.monotonic())  # a fast pace: all six claimed ahead at once
    real_step, calls = claimer.steps.step, []

    def loses_the_first_answer(finished: Any, claims: Any, *, again: bool = False) -> Any:
        jobs = real_step(finished, claims, again=again)
        calls.append((len(claims), again, len(jobs)))
        if len(calls) == 1:
            raise redis_module.ConnectionError("the answer was lost")
        return jobs

    claimer.steps.step = loses_the_first_answer  # type: ignore[method-assign]
    claimer.start()
    try:
        wait_until(lambda: len(worker.leases._members) == 6, 10, "the first step's claims held")
        assert client.zcard(keys.started("worker")) == 6  # no second set of claims
        (asked, first_again, first_got), (asked_again, again, got) = calls[:2]
        assert (first_again, first_got, again, got) == (False, 6, True, 6) and asked_again == asked
    finally:
        worker._stop_requested = True
        claimer.close()
        claimer.join(10)
    assert drain() == {"succeeded": 6}  # given back at the stop, none lost or left running
    assert sorted(e["payload"]["n"] for e in traces("record")) == list(range(6))
    assert {JobRun.objects.get(pk=r.run_id).attempt for r in runs} == {1}


def test_an_attempt_that_ends_while_the_lane_is_idle_is_finished_by_its_thread(
    worker: LaneWorker, tenants: list[Any]
) -> None:
    # The claimer waits for work on the lane's wake key; a cap slot must not wait with it.
    tenant = str(tenants[0].pk)
    runs = [dispatch("tests.capped", {"n": n}, tenant=tenant) for n in range(3)]  # cap 2
    client, keys = get_redis(), get_keys()
    claimer = Claimer(worker, 4, burst=False)
    claimer.start()
    try:
        first, second = claimer.take(), claimer.take()
        assert first is not None and second is not None
        # The third is parked behind the cap: the lane has nothing for a waiting thread.
        taken: list[Any] = []
        waiting = threading.Thread(target=lambda: taken.append(claimer.take()))
        waiting.start()
        wait_until(lambda: claimer._idle, 10, "the claimer waiting for work")
        meta = JobMeta.from_json(first.job.meta_raw)
        claimer.finish(
            [Finished(first.job.job_id, first.member, Outcome("ok", "succeeded", release_of(None, meta)))]
        )
        # Told by this thread at once: the slot is free, and the claimer, woken, claims the third.
        assert client.zscore(keys.started("worker"), first.member) is None
        waiting.join(10)
        assert [ready.job.job_id for ready in taken] == [runs[2].job_id]
    finally:
        worker._stop_requested = True
        claimer.close()
        claimer.join(10)


def test_upkeep_keeps_its_rounds_when_the_wall_clock_steps_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """An NTP correction, a VM restored from a snapshot: the wall clock an hour back stalled every
    upkeep task (reaper, repair, outbox, rebuild, claim counts) for that hour. Their rounds go by
    the monotonic clock now, and promotion, whose times are the wall clock's, runs again at once."""
    import types

    from kumiko_jobs import lane_upkeep

    for schedule in (True, False):
        upkeep = LaneWorker("worker", schedule=schedule).upkeep
        upkeep.run()
        assert not upkeep.due()
        stepped_back = types.SimpleNamespace(time=lambda: time.time() - 3600, monotonic=time.monotonic)
        monkeypatch.setattr(lane_upkeep, "time", stepped_back)
        if schedule:
            assert upkeep.due()  # promotion: its next round an hour ahead cannot be right
        else:
            time.sleep(lane_upkeep.CLAIMS_FLUSH_INTERVAL + 0.05)
            assert upkeep.due()  # the claim count's round came, an hour "early"
        monkeypatch.undo()


def test_jobs_given_back_for_busy_threads_are_not_claimed_again_at_once(worker: LaneWorker) -> None:
    """The pace that claimed them ahead is over once every thread is busy with a long job:
    claiming ahead again in the same step took the same jobs back (their flows first in the
    ring), once a second."""
    from kumiko_jobs.claiming import HOLD_READY, ReadyJob
    from kumiko_jobs.lane import ClaimedJob

    claimer = Claimer(worker, 32, burst=False)
    now = time.monotonic()
    claimer._pace.ended(128, now)  # a fast pace a moment ago
    claimer._out = 32  # every thread runs a long job; none waits
    held = [ReadyJob(ClaimedJob(f"j{n}", b"", b""), f"j{n}:x", now - HOLD_READY - 1) for n in range(3)]
    claimer._ready.extend(held)
    with claimer._lock:
        finished, returned, want = claimer._next_step()
    assert (finished, returned, want) == ([], held, 0)
