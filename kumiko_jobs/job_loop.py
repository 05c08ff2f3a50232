"""The job loop of a one-thread worker (``runjobs`` without ``--threads``), in the main thread:
finish the previous attempt and claim the next job in one round trip, run it, repeat, and do
the lane's upkeep between jobs (worker.py). A success's record write overlaps the next lane step
(outcomes.py, ``settle="after_step"``). ``--threads N`` runs job_threads.py instead.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import redis

from kumiko_jobs.execution import run_claimed
from kumiko_jobs.lane import Claim, ClaimedJob, Finished, promote_due
from kumiko_jobs.outage import RedisOutage

if TYPE_CHECKING:
    from kumiko_jobs.worker import LaneWorker

MAX_BLOCK = 1.0


class JobLoop:
    def __init__(self, worker: LaneWorker) -> None:
        self.worker = worker
        self.member = ""  # the lease member of the run this loop is executing
        self.thread_ident = 0

    def run(self, burst: bool) -> None:
        self.thread_ident = threading.get_ident()
        w = self.worker
        finished: Finished | None = None  # the attempt whose outcome Redis is told next
        # What is left of that attempt's success once Redis is told (outcomes.py): its record
        # write's answer, which overlaps the lane step, and its signals.
        settle: Callable[[], None] | None = None
        outage = RedisOutage(w.name)
        while True:
            ticket = not w.stopping() and w.take_ticket()
            # 48 random bits, as uuid4().hex[:12] has, without its os.urandom() call: a system
            # call per job that lets go of the GIL, one more hand-off among --threads N threads.
            # (random reseeds itself in a forked child.)
            execution_id = f"{random.getrandbits(48):012x}"
            claim = Claim(w.name, execution_id, time.time() + w.lease) if ticket else None
            try:
                try:
                    if w.upkeep_due():
                        # Upkeep's repairs use this thread's database connection, which a
                        # settling write holds until its answer is read.
                        settle = _settled(settle)
                        w.upkeep()
                    jobs = w.steps.step([finished] if finished else [], [claim] if claim else [])
                    job = jobs[0] if jobs else None
                    if job is not None:
                        # Renewed from its claim on: the previous success may still be settling
                        # below, and waits out a database outage or a row lock for as long as it
                        # takes, past ABANDON_AFTER; an unrenewed lease would be reaped and its
                        # run started again by another worker.
                        self.member = f"{job.job_id}:{execution_id}"
                        w.leases.hold(self.member)
                finally:
                    settle = _settled(settle)
            except redis.RedisError as exc:
                # Redis restarting, failing over or refusing a script: keep the finished attempt
                # (its record is written) and try again with backoff, instead of dying.
                if ticket:
                    w.return_ticket()
                if claim is None and finished is None:
                    return
                outage.wait(exc)
                continue
            outage.over()
            if finished is not None:
                # Renewed until Redis heard how it ended: its success may have settled before
                # this step (upkeep), waiting out the database as long as it took.
                w.leases.release(finished.member)
            finished = None
            if claim is None:
                return
            if job is None:
                w.return_ticket()
                if not self._wait_for_work(burst, outage):
                    return
                continue
            w.note_claims()
            finished = self._run(job)
            settle = finished.outcome.settle

    def _run(self, job: ClaimedJob) -> Finished:
        w = self.worker  # its lease is held from its claim until Redis is told how it ended (run)
        w.busy(+1)
        try:
            outcome = run_claimed(job, worker=w.name, consumer_lane=w.lane, observer=w.marker)
        finally:
            w.busy(-1)
            member, self.member = self.member, ""
        w.tally(outcome.counted_as)
        if outcome.retry_at and w.schedule:
            # Wake for this run's own retry or deferral, not at the next promotion round.
            w.wake_at(outcome.retry_at)
        return Finished(job.job_id, member, outcome)

    def _wait_for_work(self, burst: bool, outage: RedisOutage) -> bool:
        """Block on the lane's wake token (one key, not one per tenant; producers arm it).
        False: stop (burst mode and nothing queued or due)."""
        w = self.worker
        try:
            if burst and w.nothing_due():
                return False
            timeout = max(0.05, min(MAX_BLOCK, w.next_promote - time.time())) if w.schedule else MAX_BLOCK
            w.waiting = True  # a stop signal may end the wait at once
            try:
                w.client.blpop([w.keys.wake(w.lane)], timeout)
            finally:
                w.waiting = False
        except redis.RedisError as exc:
            outage.wait(exc)
        return True


def _settled(settle: Callable[[], None] | None) -> Callable[[], None] | None:
    """Settle what is left of a success (once) and say nothing is left."""
    if settle is not None:
        settle()
    return None


def nothing_due(worker: LaneWorker) -> bool:
    if not worker.schedule:
        return True
    next_due = promote_due(worker.client, worker.keys, worker.lane)
    if next_due is not None and next_due <= time.time():
        return False
    # promote_due may have moved work into the lane; the next claim tells.
    return not worker.client.exists(worker.keys.ring(worker.lane))
