"""Record "running" only for runs that last: short runs go from queued to their outcome.

A worker would otherwise commit twice per job; the start of a short run is still recorded
(started_at and worker are written with its outcome). A run that lasts longer than
``RUNNING_MARK_DELAY`` is marked running by this thread, so operators see what is running.
One marker serves every job thread of a process; each thread has at most one run in it. A
run's outcome is written only after any "running" write of it ended (``finishing`` waits for
it), and job_started precedes the outcome's signals. The write and job_started go out with the
lock released: a slow job_started receiver (a webhook) holds up only its own run's outcome, not
every job thread's start and finish.
"""

from __future__ import annotations

import heapq
import threading
import time
from typing import TYPE_CHECKING

from django.db import connections

from kumiko_jobs import attempt_records, guarded_writes, run_events
from kumiko_jobs.exceptions import StaleAttempt
from kumiko_jobs.jobdata import JobMeta

if TYPE_CHECKING:
    from kumiko_jobs.outcomes import Settle

Pending = tuple[JobMeta, attempt_records.Started, int]  # the run, and its entry's sequence


def mark_running(meta: JobMeta, start: attempt_records.Started) -> bool:
    """Write "running" (a failed write is logged, never raised: the outcome still records the
    start), then send job_started. False: the run moved on (StaleAttempt, logged), nothing was
    written or sent, and the outcome's write will find the same."""
    try:
        guarded_writes.safe(
            attempt_records.mark_running,
            meta=meta,
            job_id=start.job_id,
            payload=start.payload,
            worker=start.worker,
            now=start.at,
        )
    except StaleAttempt as exc:
        attempt_records.log_stale(exc)
        return False
    run_events.started(meta, start.job_id)
    return True


class RunningMarker(threading.Thread):
    # A worker's successes are written and said by its writer thread (success_writes.py).
    settle: Settle = "by_writer"

    def __init__(self, delay: float) -> None:
        super().__init__(name="kumiko-running-marker", daemon=True)
        self.delay = delay
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # the marker waits here for the next due entry
        self._marked = threading.Condition(lock)  # job threads wait here for their run's mark
        self._marking: int | None = None  # the job thread whose run is being marked
        self._pending: dict[int, Pending] = {}  # job thread -> its run, until marked or finishing
        self._due: list[tuple[float, int, int]] = []  # (due, sequence, job thread), a heap
        self._sequence = 0
        self._stopped = False

    def started(self, meta: JobMeta, start: attempt_records.Started) -> None:
        with self._cond:
            slot = threading.get_ident()
            self._sequence += 1
            self._pending[slot] = (meta, start, self._sequence)
            heapq.heappush(self._due, (time.monotonic() + self.delay, self._sequence, slot))
            # Every entry is due a fixed delay after its start, never before the heap's head: a
            # marker with entries wakes at the head's time anyway. Only one waiting on an empty
            # heap needs waking (measured: the notify was 8% of GIL time with 8 job threads).
            if len(self._due) == 1:
                self._cond.notify()

    def finishing(self) -> bool:
        """Whether this thread's run had its start recorded (and job_started sent) by the marker;
        waits for that write if it is in flight."""
        slot = threading.get_ident()
        with self._cond:
            if self._pending.pop(slot, None) is not None:
                return False  # not due yet: the outcome records the start
            while self._marking == slot:
                self._marked.wait()
            return True  # gone from pending: the marker took it and recorded the start

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def run(self) -> None:
        try:
            while (taken := self._take_due()) is not None:
                meta, start = taken
                try:
                    # Outside the lock; the run's own finishing() waits for it.
                    mark_running(meta, start)
                finally:
                    with self._cond:
                        self._marking = None
                        self._marked.notify_all()
        finally:
            connections.close_all()  # this thread's own connections

    def _take_due(self) -> tuple[JobMeta, attempt_records.Started] | None:
        """Wait for the next run due to be marked and take it (None: stopped)."""
        with self._cond:
            while not self._stopped:
                due = self._next_due()
                if due is None:
                    self._cond.wait()
                    continue
                at, slot = due
                wait = at - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._due)
                meta, start, _sequence = self._pending.pop(slot)
                self._marking = slot
                return meta, start
            return None

    def _next_due(self) -> tuple[float, int] | None:
        """The earliest run still waiting to be marked (entries of finished runs are dropped)."""
        while self._due:
            at, sequence, slot = self._due[0]
            pending = self._pending.get(slot)
            if pending is not None and pending[2] == sequence:
                return at, slot
            heapq.heappop(self._due)  # its run finished (or a newer run of the slot replaced it)
        return None
