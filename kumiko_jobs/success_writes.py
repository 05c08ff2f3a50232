"""The success writes of a ``runjobs`` process, on a thread and a database connection of their
own: a job loop (the main thread, or a ``--threads`` job thread) hands its success over and
takes its next job at once.

The writer takes every success handed over since its last write, writes them in one round trip
and one transaction (attempt_records.write_outcomes: pg_pipeline, asynchronous commit; one by
one where that is not available), then hands their finishes to the claimer, which tells Redis
with its next step (claiming.py), then says each success (log line, metrics, job_succeeded) in
its attempt's OpenTelemetry context. So a record is written before Redis hears of its outcome,
and a success is said once it is written.

Receivers of job_succeeded run on this thread: a slow one delays the next successes' writes and
the freeing of their cap slots (not the job threads), so keep receivers short or have them
dispatch a job.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import TYPE_CHECKING

from kumiko_jobs.attempt_records import write_outcomes
from kumiko_jobs.lane import Finished
from kumiko_jobs.outcomes import Outcome

if TYPE_CHECKING:
    from kumiko_jobs.claiming import Claimer

logger = logging.getLogger("kumiko_jobs.worker")
MAX_BATCH = 200


class SuccessWriter(threading.Thread):
    """``put()`` from the job threads; ``close()`` from the worker once they have ended."""

    def __init__(self, claimer: Claimer) -> None:
        super().__init__(name="kumiko-writer", daemon=True)
        self.claimer = claimer
        self._lock = threading.Lock()
        self._handed = threading.Condition(self._lock)
        self._pending: list[Finished] = []
        self._writing = 0  # the successes of the batch being written now
        self._closed = False
        self.writes = 0  # batches (one round trip each on PostgreSQL), and the successes they carried
        self.written = 0

    def put(self, finished: Finished) -> None:
        """A success whose ``Outcome.update`` is to be written."""
        if finished.outcome.update is None:
            raise ValueError(f"job {finished.job_id}: only a success built for the writer can be handed over")
        with self._lock:
            self._pending.append(finished)
            self._handed.notify()

    def close(self) -> None:
        """Write what is left, then end."""
        with self._lock:
            self._closed = True
            self._handed.notify()

    @property
    def unwritten(self) -> int:
        """Successes handed over whose write has not returned yet."""
        with self._lock:
            return len(self._pending) + self._writing

    def run(self) -> None:
        from django.db import connections

        try:
            while (batch := self._next_batch()) is not None:
                self._write(batch)
                with self._lock:
                    self._writing = 0
        except BaseException:
            self.claimer.worker.thread_failed("the writer")
        finally:
            connections.close_all()  # this thread's own

    def _next_batch(self) -> list[Finished] | None:
        with self._lock:
            while not self._pending:
                if self._closed:
                    return None
                self._handed.wait()
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            self._writing = len(batch)
            return batch

    def _write(self, batch: list[Finished]) -> None:
        stale = write_outcomes([u for finished in batch if (u := finished.outcome.update) is not None])
        self.writes += 1
        self.written += len(batch)
        if stale:
            # Runs that moved on while their worker stalled: the claimer lets their leases go and
            # tells Redis nothing of them, and they are not said.
            batch = [
                dataclasses.replace(f, outcome=Outcome("stale", "stale")) if i in stale else f
                for i, f in enumerate(batch)
            ]
        self.claimer.finish(batch)
        for finished in batch:
            settle = finished.outcome.settle
            if settle is None:
                continue
            try:
                settle()
            except Exception:  # the run is written and Redis told: never lose the thread over it
                logger.exception("kumiko_jobs: saying the success of job %s failed", finished.job_id)
