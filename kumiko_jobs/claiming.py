"""The intake of a ``runjobs`` process: one thread, the claimer, makes every lane step of the
process's job loops (the main thread with one thread, ``--threads N`` job threads) and keeps a
few claimed jobs ready for them.

Why: a job thread that made its own lane step after each job waited for that round trip, and
for its success's record write, before it could start the next job; with 8 threads that was
1-2 ms of every 20 ms job here, and each wait gave the GIL to the others and waited to get it
back (BENCHMARKS.md, session 7). Now a job thread takes its next job from the claimer and hands
back how its last one ended, and the claimer sends the finishes and claims that came in
meanwhile in one script call (lane.step): with N busy threads a call carries several of each.

What stays as with separate workers: claims are taken one at a time from the ring, so fairness
and tenant caps are the same; a job waiting ready in the process holds its lease (the heartbeat
renews it) and its tenant's cap slot, as a running one does; its recorded start is when its
thread starts it. A finish is sent after the attempt's record is written (success_writes.py for
successes).

How many jobs wait ready (the prefetch): what the threads finish in PREFETCH_WAIT at their
recent pace, at most PREFETCH_PER_THREAD per thread. So a claimed job waits about PREFETCH_WAIT
at most before a thread starts it, and on a lane of long jobs (8 threads of 1 s jobs finish 8 a
second: none) jobs are claimed only for threads that wait, as before. Jobs claimed ahead that no
thread takes within HOLD_READY (every thread went on to a long job) are given back to the front
of their flows, as at a stop, so they do not wait for that job's end while another worker idles.

Stopping: at a stop signal, a recycle or the end of --max-jobs the claimer stops claiming, gives
the ready jobs back to the front of their flows (no attempt used, their records untouched), and
keeps sending finishes until the worker closes it. With --burst it says "done" once the lane has
nothing queued or due and no job is out. On an idle lane it blocks on the lane's wake key; an
attempt that ends meanwhile is finished by the thread that hands it back (one script call, no
claim), so no cap slot waits for the claimer. It blocks on its worker's own wake key too, which
the worker pushes to when it stops: an idle worker stops at once, not after MAX_BLOCK.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from kumiko_jobs import outcomes
from kumiko_jobs.lane import Claim, ClaimedJob, Finished, Stepper, step
from kumiko_jobs.outage import RedisOutage

if TYPE_CHECKING:
    from kumiko_jobs.worker import LaneWorker


# A ready job waits about this long at most before a thread starts it (see the docstring).
# Measured, 8 threads of trivial jobs against Dramatiq in alternating rounds: 0.93 with 10 ms,
# 1.14 with 20 ms; 20 ms jobs the same with either.
PREFETCH_WAIT = 0.02
# And never more than this many per thread (Celery's default prefetch multiplier): with N busy
# threads, the claimer waits for the GIL behind them and its next call comes late; one ready
# job per thread ran dry meanwhile (measured: 8 threads of trivial jobs, 0.80 of Dramatiq's
# rate with one per thread, 1.00-1.09 with four; eight did no better).
PREFETCH_PER_THREAD = 4
# Longest wait for work on an idle lane: how soon an idle worker sees jobs that stock RQ code
# pushed without waking it (RQ's scheduler, the dashboard's requeue). A stop wakes it at once.
MAX_BLOCK = 1.0
# How long a stop's wake token outlives a claimer that was not waiting for it.
STOP_WAKE_TTL = 60
CHECK_INTERVAL = 0.2


# A ready job that no thread took within this long, while none waits for one, goes back to the
# front of its flow (its lease and cap slot freed, no attempt used): the threads are busy with
# long jobs, and another worker may be idle. Without it, jobs claimed ahead at a fast pace waited
# for the end of a 10-minute job that a thread started next. Far above PREFETCH_WAIT.
HOLD_READY = 1.0


@dataclass(frozen=True)
class ReadyJob:
    """A claimed job, its lease member (``<job id>:<execution id>``), and when it was claimed
    (``time.monotonic()``)."""

    job: ClaimedJob
    member: str
    at: float


class Pace:
    """How many jobs the threads finished per second lately: the last ``window`` finishes."""

    def __init__(self, window: int) -> None:
        self._ends: deque[float] = deque(maxlen=window)

    def ended(self, count: int, now: float) -> None:
        self._ends.extend([now] * count)

    def per_second(self, now: float) -> float:
        if len(self._ends) < 2:
            return 0.0
        return len(self._ends) / max(now - self._ends[0], 1e-6)


class Claimer(threading.Thread):
    """``take()`` and ``finish()`` from the job threads; ``close()`` from the worker once they
    have ended (see the module docstring)."""

    def __init__(self, worker: LaneWorker, threads: int, *, burst: bool) -> None:
        super().__init__(name="kumiko-claimer", daemon=True)
        self.worker, self.threads, self.burst = worker, threads, burst
        self.steps = Stepper(worker.client, worker.keys, worker.lane)
        self._lock = threading.Lock()
        self._job_ready = threading.Condition(self._lock)  # job threads wait here
        self._wanted = threading.Condition(self._lock)  # the claimer waits here
        self._ready: deque[ReadyJob] = deque()
        self._finished: list[Finished] = []  # ended attempts Redis is told of next
        self._waiting = 0  # job threads waiting in take()
        self._out = 0  # jobs taken and not handed back
        self._idle = False  # blocked on the wake key: finish() sends by itself
        self._done = False  # no more jobs: take() says None
        self._closed = False
        self._pace = Pace(4 * threads)

    # Job threads ------------------------------------------------------------------------
    def take(self, timeout: float | None = None) -> ReadyJob | None:
        """The calling thread's next job, waiting while none is ready; None: stop, or none
        ready within ``timeout`` seconds (``ended()`` tells which)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._waiting += 1
            try:
                while not self._ready or self.worker.stopping():
                    if self._done or self.worker.stopping():
                        return None
                    self._wanted.notify()
                    if deadline is None:
                        self._job_ready.wait()
                    elif (left := deadline - time.monotonic()) <= 0 or not self._job_ready.wait(left):
                        return None
            finally:
                self._waiting -= 1
            self._out += 1
            if len(self._ready) == 1:
                self._wanted.notify()  # the last one ready: claim more
            return self._ready.popleft()

    def ended(self) -> bool:
        """Whether take() will hand out no more jobs."""
        with self._lock:
            return self._done or self.worker.stopping()

    def finish(self, finished: Sequence[Finished]) -> None:
        """How taken jobs ended (their records written): Redis is told with the next step."""
        with self._lock:
            self._out -= len(finished)
            self._pace.ended(len(finished), time.monotonic())
            if not self._idle:
                self._finished += finished
                self._wanted.notify()
                return
        self._finish_alone(finished)

    def _finish_alone(self, finished: Sequence[Finished]) -> None:
        """While the claimer waits for work: tell Redis in this thread (one call, no claim)."""
        w = self.worker
        try:
            step(w.client, w.keys, w.lane, finished, [])
        except redis.RedisError:
            with self._lock:  # the claimer sends them once Redis answers again
                self._finished += finished
                self._wanted.notify()
            return
        for attempt in finished:
            w.leases.release(attempt.member)

    # The worker ---------------------------------------------------------------------------
    def close(self) -> None:
        """The job threads have ended: send what is left, give back what is ready, end."""
        with self._lock:
            self._closed = True
            self._wanted.notify()
        self.stop_waiting()

    def stop_waiting(self) -> None:
        """The worker stops: end the claimer's wait for work now, so its job threads hear of the
        stop (and the worker ends) without waiting out MAX_BLOCK. Called by the worker's main
        thread, not in the signal handler (which may have interrupted a Redis call)."""
        with self._lock:
            if not self._idle:
                return  # _wait_for_work checks for a stop before it blocks
        w = self.worker
        key = w.keys.stop_wake(w.lane, w.name)
        try:
            with w.client.pipeline(transaction=True) as pipe:
                pipe.rpush(key, "stop")
                pipe.expire(key, STOP_WAKE_TTL)
                pipe.execute()
        except redis.RedisError:
            pass  # the wait ends by itself within MAX_BLOCK (or meets the outage)

    # The claimer thread -------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._serve()
        except BaseException:
            self.worker.thread_failed("the claimer")
        finally:
            with self._lock:
                self._done = True
                self._job_ready.notify_all()
            self.steps.close()

    def _serve(self) -> None:
        w = self.worker
        outage = RedisOutage(w.name)
        unanswered = False
        finished: list[Finished] = []
        returned: list[ReadyJob] = []
        claims: list[Claim] = []
        while True:
            if not unanswered:
                with self._lock:
                    to_send, returned, want = self._next_step()
                if to_send is None:
                    return
                finished, claims = to_send, self._claims(want)
            else:
                # Their leases run from now: an outage may have outlasted the first deadlines.
                deadline = time.time() + w.lease
                claims = [Claim(c.worker, c.execution_id, deadline) for c in claims]
            try:
                # Last claimed first: each goes back to the front of its flow.
                given_back = [self._given_back(ready) for ready in reversed(returned)]
                jobs = self.steps.step([*finished, *given_back], claims, again=unanswered)
            except redis.RedisError as exc:
                # Sent again as it is, until Redis answers: the call may have run (a timeout, a
                # connection lost after the send; script_calls' own resend failed too). Its
                # claims then hold jobs under these execution ids, which the resend returns
                # (again=1) instead of claiming more (new ids left them to the reaper, an
                # attempt each); its given-back jobs are back in their flows, and must not run
                # here; its finishes are taken by lease member, once.
                unanswered = True
                outage.wait(exc)
                continue
            unanswered = False
            outage.over()
            self._stepped(finished, returned, claims, jobs)
            if len(jobs) < len(claims) and not self._wait_for_work():
                with self._lock:
                    self._done = True
                    self._job_ready.notify_all()

    def _next_step(self) -> tuple[list[Finished] | None, list[ReadyJob], int]:
        """(Under the lock.) Wait until there is something to send: the finishes, the ready jobs
        to give back and how many jobs to claim; (None, ...) once closed and all is sent."""
        while True:
            stopping = self.worker.stopping() or self._closed
            returned = list(self._ready) if stopping else self._held_too_long()
            want = 0 if stopping or self._done else self._want()
            if self._finished or returned or want:
                finished, self._finished = self._finished, []
                if stopping:
                    self._ready.clear()
                    self._done = True
                    self._job_ready.notify_all()
                return finished, returned, want
            if self._closed:
                return None, [], 0
            if stopping and not self._done:
                self._done = True
                self._job_ready.notify_all()
            self._wanted.wait(CHECK_INTERVAL)

    def _held_too_long(self) -> list[ReadyJob]:
        """(Under the lock.) The ready jobs held past HOLD_READY while no thread waits: taken out
        of the ready queue, to be given back (the oldest are first in it)."""
        if self._waiting:
            return []
        limit = time.monotonic() - HOLD_READY
        held: list[ReadyJob] = []
        while self._ready and self._ready[0].at <= limit:
            held.append(self._ready.popleft())
        if held:
            # The pace that claimed them ahead is over: claiming ahead again at once would take
            # the same jobs back (their flows are first in the ring).
            self._pace = Pace(4 * self.threads)
        return held

    def _want(self) -> int:
        """How many jobs to claim: one per waiting thread, and what keeps the prefetch full."""
        pace = self._pace.per_second(time.monotonic())
        depth = min(PREFETCH_PER_THREAD * self.threads, int(pace * PREFETCH_WAIT))
        free = self.threads - self._out  # threads that are not running a job
        return max(0, min(free + depth, self._waiting + depth) - len(self._ready))

    def _claims(self, want: int) -> list[Claim]:
        w = self.worker
        claims = []
        for _ in range(want):
            if not w.take_ticket():
                break
            # 48 random bits, as uuid4().hex[:12] has, without its os.urandom() call.
            claims.append(Claim(w.name, f"{random.getrandbits(48):012x}", time.time() + w.lease))
        if want and not claims:
            with self._lock:  # --max-jobs used up: nothing more to claim
                if not self._ready:
                    self._done = True
                    self._job_ready.notify_all()
        return claims

    def _given_back(self, ready: ReadyJob) -> Finished:
        job = ready.job
        return Finished(job.job_id, ready.member, outcomes.given_back(job.job_id, job.meta_raw))

    def _stepped(
        self, finished: list[Finished], returned: list[ReadyJob], claims: list[Claim], jobs: list[ClaimedJob]
    ) -> None:
        w = self.worker
        for attempt in finished:
            w.leases.release(attempt.member)
        for ready in returned:
            w.leases.release(ready.member)
            w.return_ticket()
        for _claim in claims[len(jobs) :]:
            w.return_ticket()
        claimed = zip(jobs, claims[: len(jobs)], strict=True)
        now = time.monotonic()
        ready_jobs = [
            ReadyJob(job, f"{job.job_id}:{job.execution_id or claim.execution_id}", now)
            for job, claim in claimed
        ]
        for ready in ready_jobs:
            w.leases.hold(ready.member)
        w.note_claims(len(ready_jobs))
        with self._lock:
            self._ready.extend(ready_jobs)
            self._job_ready.notify(len(ready_jobs))

    def _wait_for_work(self) -> bool:
        """The lane ran dry: wait for work to come (or for jobs out to end, with --burst); False:
        done (--burst, and nothing is queued, due or out)."""
        w = self.worker
        if self.burst:
            with self._lock:
                settled = self._out == 0 and not self._finished and not self._ready
            if settled and w.upkeep.nothing_due():
                return False
            with self._lock:
                # Jobs still out may be retried or free a cap slot: wait for their finishes.
                if not self._finished:
                    self._wanted.wait(CHECK_INTERVAL)
            return True
        with self._lock:
            if self._finished or self._closed or w.stopping():
                return True
            self._idle = True
        try:
            promote_in = w.upkeep.next_promote - time.time()
            timeout = max(0.05, min(MAX_BLOCK, promote_in)) if w.schedule else MAX_BLOCK
            w.client.blpop([w.keys.wake(w.lane), w.keys.stop_wake(w.lane, w.name)], timeout)
        except redis.RedisError:
            pass  # the next step meets the outage
        finally:
            with self._lock:
                self._idle = False
        return True
