"""The job loops of ``runjobs``: the ``--threads N`` job threads, or the main thread with one
(worker.py, ``JobThread.run_one``). Each takes its next job from the claimer (claiming.py),
runs it, and hands its outcome back: a success to the writer thread, which
writes it together with other threads' ones (success_writes.py), anything else (written already,
in the strict order of outcomes.py) to the claimer. A thread makes no round trip of its own
between jobs when a job is ready.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from kumiko_jobs.claiming import Claimer, ReadyJob
from kumiko_jobs.execution import run_claimed
from kumiko_jobs.lane import Finished
from kumiko_jobs.success_writes import SuccessWriter

if TYPE_CHECKING:
    from kumiko_jobs.worker import LaneWorker


class JobThread:
    def __init__(self, worker: LaneWorker, claimer: Claimer, writer: SuccessWriter) -> None:
        self.worker, self.claimer, self.writer = worker, claimer, writer
        self.member = ""  # the lease member of the run this thread is executing
        self.thread_ident = 0

    def run(self) -> None:
        self.thread_ident = threading.get_ident()
        while (ready := self.claimer.take()) is not None:
            self.run_one(ready)

    def run_one(self, ready: ReadyJob) -> None:
        """Run a job taken from the claimer and hand back how it ended."""
        w = self.worker
        self.member = ready.member
        w.busy(+1)
        try:
            outcome = run_claimed(ready.job, worker=w.name, consumer_lane=w.lane, observer=w.marker)
        finally:
            w.busy(-1)
            self.member = ""
        w.tally(outcome.counted_as)
        if outcome.retry_at and w.schedule:
            # Wake for this run's own retry or deferral, not at the next promotion round.
            w.upkeep.wake_at(outcome.retry_at)
        finished = Finished(ready.job.job_id, ready.member, outcome)
        if outcome.update is not None:
            self.writer.put(finished)
        else:
            self.claimer.finish([finished])


def start_intake(worker: LaneWorker, threads: int, burst: bool) -> tuple[Claimer, SuccessWriter]:
    """The claimer and the writer that serve ``threads`` job loops, started."""
    claimer = Claimer(worker, threads, burst=burst)
    writer = SuccessWriter(claimer)
    claimer.start()
    writer.start()
    return claimer, writer


def start_job_threads(
    worker: LaneWorker, claimer: Claimer, writer: SuccessWriter, count: int
) -> list[tuple[threading.Thread, JobThread]]:
    threads = []
    for number in range(count):
        job_thread = JobThread(worker, claimer, writer)
        # Daemon threads: a second signal (cold stop) or a recycle must not wait for a stuck one.
        name = f"kumiko-job-{number + 1}"
        thread = threading.Thread(target=_thread_main, args=(job_thread,), name=name, daemon=True)
        thread.start()
        threads.append((thread, job_thread))
    return threads


def _thread_main(job_thread: JobThread) -> None:
    from django.db import connections

    from kumiko_jobs.async_handlers import close_thread_loop

    try:
        job_thread.run()
    except BaseException:
        job_thread.worker.thread_failed("a job thread")
    finally:
        close_thread_loop()  # its async handlers' event loop and database thread
        connections.close_all()  # this thread's own connections
