"""Record "running" only for runs that last: short runs go from queued to their outcome.

A worker would otherwise commit twice per job; the start of a short run is still recorded
(started_at and worker are written with its outcome). A run that lasts longer than
``RUNNING_MARK_DELAY`` is marked running by this thread, so operators see what is running.
The lock orders the writes: the outcome is written only after any "running" write finished.
"""

from __future__ import annotations

import threading
import time

from django.db import connections

from kumiko_jobs import records, run_events
from kumiko_jobs.jobdata import JobMeta


class RunningMarker(threading.Thread):
    def __init__(self, delay: float) -> None:
        super().__init__(name="kumiko-running-marker", daemon=True)
        self.delay = delay
        self._cond = threading.Condition()
        self._current: tuple[JobMeta, records.Started, float] | None = None
        self._stopped = False

    def started(self, meta: JobMeta, start: records.Started) -> None:
        with self._cond:
            self._current = (meta, start, time.monotonic() + self.delay)
            self._cond.notify()

    def finishing(self) -> bool:
        """Whether this thread recorded the run's start (and sent job_started)."""
        with self._cond:  # waits for a "running" write in flight
            recorded = self._current is None
            self._current = None
            return recorded

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def run(self) -> None:
        try:
            with self._cond:
                while not self._stopped:
                    if self._current is None:
                        self._cond.wait()
                        continue
                    meta, start, due = self._current
                    wait = due - time.monotonic()
                    if wait > 0:
                        self._cond.wait(wait)
                        continue
                    records.safe(
                        records.mark_running,
                        meta=meta,
                        job_id=start.job_id,
                        payload=start.payload,
                        worker=start.worker,
                        now=start.at,
                    )
                    # Under the lock, so it precedes the outcome's signals (finishing() waits).
                    run_events.started(meta, start.job_id)
                    self._current = None
        finally:
            connections.close_all()  # this thread's own connections
