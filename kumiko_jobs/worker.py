"""The lane worker: RQ's SimpleWorker (registration, signals, dashboards) with a lean hot path.

Jobs run in-process; the README explains why (measured: forking per job costs ~2x and a DB
connection per job). A claimer thread makes the process's lane steps (finish the jobs that
ended and claim the next ones, several in one script call, lane.step) and keeps a few claimed
jobs ready (claiming.py); a writer thread writes successes, several in one round trip, before
Redis hears of them (success_writes.py). Claims are taken one at a time from the ring, so
fairness and caps work exactly as across processes.

With one thread (the default) the main thread runs the jobs (a timeout is SIGALRM, which
interrupts a blocking call) and, between them, the lane's upkeep (lane_upkeep.py: promotion,
reaper, repair, outbox, rebuild). ``--threads N`` runs N job threads (job_threads.py), each with
its own database connection, and the main thread does the upkeep and handles signals. Leases,
"running" marks and timeouts are per running job.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import uuid
from datetime import datetime
from typing import Any

import redis
from rq import Queue
from rq.serializers import JSONSerializer
from rq.utils import now as rq_now
from rq.worker import SimpleWorker, WorkerStatus

from kumiko_jobs import faults
from kumiko_jobs.async_handlers import close_thread_loop
from kumiko_jobs.claiming import Claimer
from kumiko_jobs.conf import get_config, redis_description
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.db_connections import opened_connections
from kumiko_jobs.job_threads import JobThread, start_intake, start_job_threads
from kumiko_jobs.lane import count_claims
from kumiko_jobs.lane_upkeep import TICK, LaneUpkeep
from kumiko_jobs.leases import Heartbeat
from kumiko_jobs.observability import flush_telemetry
from kumiko_jobs.run_marker import RunningMarker
from kumiko_jobs.success_writes import SuccessWriter
from kumiko_jobs.supervisor import EXIT_RECYCLE
from kumiko_jobs.timeouts import watchdog

logger = logging.getLogger("kumiko_jobs.worker")
# A process being recycled gives its other threads this long to finish their jobs.
RECYCLE_WAIT = 30.0


class LaneWorker(SimpleWorker):
    """Consumes exactly one lane (one RQ queue), so every pop is atomic and crash-safe."""

    def __init__(
        self, lane: str, *, name: str | None = None, schedule: bool = True, threads: int = 1, **kwargs: Any
    ) -> None:
        self.lane = lane
        self.keys = get_keys()
        self.client = get_redis()
        self.schedule = schedule
        self.threads = threads
        queue = Queue(self.keys.queue_name(lane), connection=self.client, serializer=JSONSerializer)
        super().__init__(
            [queue],
            connection=self.client,
            name=name or f"{self.keys.id_tag}-{lane}-{uuid.uuid4().hex[:10]}",
            serializer=JSONSerializer,
            worker_ttl=int(get_config()["ABANDON_AFTER"]),
            **kwargs,
        )
        self.lease = float(get_config()["ABANDON_AFTER"])
        self.counts: dict[str, int] = {}
        self.recycle_reason = ""
        self._lock = threading.Lock()
        self._tickets: int | None = None  # claims left under --max-jobs (None: no limit)
        self._busy = 0
        self._claimed = 0  # claims not yet taken off the lane's queued count
        self.upkeep = LaneUpkeep(self)
        self.leases = Heartbeat(self.client, self.keys, self.lane, self.key, on_lost=self._register_again)
        self.marker = RunningMarker(float(get_config()["RUNNING_MARK_DELAY"]))
        self._loops: list[JobThread] = []  # --threads: the job threads (_on_stuck)
        self.batching = ""  # what the claimer's calls and the writer's writes carried (shutdown line)
        self._stuck: set[int] = set()  # job threads whose handler ignored its timeout

    def work(  # type: ignore[override]
        self, burst: bool = False, max_jobs: int | None = None, logging_level: str = "INFO", **_: Any
    ) -> bool:
        faults.crash_point("worker:start")
        self.bootstrap(logging_level)
        self._log_banner(burst, max_jobs)
        self._tickets = max_jobs
        self.client.sadd(self.keys.claimers(self.lane), self.name)
        self._install_signal_handlers()  # type: ignore[no-untyped-call]
        self.leases.start()
        self.marker.start()
        try:
            self.set_state(WorkerStatus.BUSY)
            self._run_jobs(burst)
        finally:
            # SIGTERM and --max-jobs end here: export the spans and metrics an SDK still holds
            # (first, so a lost Redis below cannot skip it).
            flush_telemetry()
            try:
                self.flush_claims()
            except redis.RedisError:
                pass  # the lane's next idle moment resets the count
            self.leases.stop()
            self.marker.stop()
            try:
                self.client.srem(self.keys.claimers(self.lane), self.name)
                self.teardown()  # type: ignore[no-untyped-call]
            except redis.RedisError:
                logger.warning("worker %s: Redis unreachable while unregistering", self.name)
        done = sum(self.counts.values())
        logger.info(
            "worker %s stopped after %d jobs %s; database connections opened: %d",
            self.name,
            done,
            self.counts,
            opened_connections(),
        )
        if self.recycle_reason:
            logger.error("worker %s exits for a restart: %s", self.name, self.recycle_reason)
            sys.exit(EXIT_RECYCLE)
        return done > 0

    def _run_jobs(self, burst: bool) -> None:
        claimer, writer = start_intake(self, self.threads, burst)
        try:
            if self.threads == 1:
                self._run_in_main_thread(claimer, writer)
            else:
                self._run_job_threads(claimer, writer)
        finally:
            # The successes handed over are written and told, the ready jobs given back: at a
            # cold stop too (a second signal cuts off the running jobs, not those that ended).
            try:
                self._close_writer(writer)
            finally:
                claimer.close()
                claimer.join(RECYCLE_WAIT)
        steps = claimer.steps
        self.batching = (
            f"{steps.carried} lane steps in {steps.calls} script calls "
            f"({steps.carried / max(steps.calls, 1):.2f} a call); "
            f"{writer.written} successes written in {writer.writes} batches"
        )
        logger.info("worker %s: %s", self.name, self.batching)

    def _close_writer(self, writer: SuccessWriter) -> None:
        """Wait for the writes of the successes handed over, up to RECYCLE_WAIT. A second signal
        during this wait (the writes wait for a row lock or a database outage) stops at once, as
        it says: their runs are left to the reapers, which go by each run's record."""
        writer.close()
        try:
            writer.join(RECYCLE_WAIT)
        finally:
            # Not ``writer.is_alive()``: on Python 3.12 a join cut off by an exception (the second
            # signal's SystemExit) marks the thread stopped while it still runs (its lock
            # "acquired" per bpo-45274's handling). The count is the writer's own.
            if unwritten := writer.unwritten:
                logger.warning(
                    "worker %s: stopping with %d success(es) whose write has not returned; once "
                    "their leases expire (ABANDON_AFTER), a reaper settles each run by its record: "
                    "succeeded if the write went through, else run again",
                    self.name,
                    unwritten,
                )

    def _run_in_main_thread(self, claimer: Claimer, writer: SuccessWriter) -> None:
        """One job thread: the main thread, so a job's timeout is SIGALRM, which interrupts a
        blocking call (timeouts.py), and a job runs where RQ's SimpleWorker runs it. The upkeep
        runs between jobs, on the same database connection (the writer has the only other)."""
        loop = JobThread(self, claimer, writer)
        # An async job whose database call outlives it is reported so (async_handlers.py).
        watchdog().on_stuck = self._on_stuck
        try:
            while True:
                self.upkeep.run_quietly()
                ready = claimer.take(timeout=TICK)
                if ready is not None:
                    loop.run_one(ready)
                elif claimer.ended():
                    return
        finally:
            close_thread_loop()  # its async handlers' event loop and database thread

    def _run_job_threads(self, claimer: Claimer, writer: SuccessWriter) -> None:
        """N job threads; the main thread does the upkeep and handles signals."""
        watchdog().on_stuck = self._on_stuck
        threads = start_job_threads(self, claimer, writer, self.threads)
        self._loops = [job_thread for _thread, job_thread in threads]
        recycle_deadline: float | None = None
        woke = False
        # A stuck thread is a daemon: it ends with the process, nobody waits for it.
        while live := [t for t, _loop in threads if t.is_alive() and t.ident not in self._stuck]:
            if self.stopping() and not woke:
                # Idle threads wait for the claimer, which may wait for work on Redis.
                claimer.stop_waiting()
                woke = True
            if self.recycle_reason and recycle_deadline is None:
                recycle_deadline = time.monotonic() + RECYCLE_WAIT
            if recycle_deadline is not None and time.monotonic() > recycle_deadline:
                break
            self.upkeep.run_quietly()
            live[0].join(TICK)  # a tick, or less once the threads end (a stop)

    def _register_again(self) -> None:
        """The heartbeat thread found this worker's key gone while it runs (Redis restarted
        without its data, a failover to an empty replica): list it again where operators count
        workers (RQ's registry, so django-rq's dashboard, and the lane's claimers)."""
        self.register_birth()  # type: ignore[no-untyped-call]
        self.set_state(self.get_state())
        self.client.sadd(self.keys.claimers(self.lane), self.name)
        logger.warning("worker %s: Redis had lost this worker's registration; registered again", self.name)

    # Shared by the job loops --------------------------------------------------------------
    def stopping(self) -> bool:
        return self._stop_requested or bool(self.recycle_reason)

    def take_ticket(self) -> bool:
        with self._lock:
            if self._tickets is None:
                return True
            if self._tickets <= 0:
                return False
            self._tickets -= 1
            return True

    def ran_max_jobs(self) -> bool:
        """Whether it stopped because it had claimed its --max-jobs."""
        with self._lock:
            return self._tickets == 0

    def return_ticket(self) -> None:
        with self._lock:
            if self._tickets is not None:
                self._tickets += 1

    def note_claims(self, count: int = 1) -> None:
        with self._lock:
            self._claimed += count

    def flush_claims(self) -> None:
        with self._lock:
            claimed, self._claimed = self._claimed, 0
        try:
            count_claims(self.client, self.keys, self.lane, claimed)
        except redis.RedisError:
            with self._lock:
                self._claimed += claimed
            raise

    def tally(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] = self.counts.get(outcome, 0) + 1

    def busy(self, delta: int) -> None:
        with self._lock:
            self._busy += delta

    def thread_failed(self, what: str) -> None:
        """Called in the except block of one of this worker's threads that ended with an
        exception: log it, and exit for a restart once the running jobs are done."""
        logger.exception("worker %s: %s stopped unexpectedly", self.name, what)
        self.request_recycle(f"{what} stopped unexpectedly")

    def request_recycle(self, reason: str) -> None:
        """Stop taking jobs and exit with EXIT_RECYCLE once the running ones are done."""
        if not self.recycle_reason:
            self.recycle_reason = reason
            logger.error("worker %s: %s; it stops taking jobs and exits for a restart", self.name, reason)

    def _on_stuck(self, ident: int, job_name: str) -> None:
        # The watchdog thread: a handler ignored its timeout (blocked in C code). Its lease is let
        # go, so the reaper retries the run, and the process is replaced.
        self._stuck.add(ident)
        for loop in self._loops:
            if loop.thread_ident == ident and loop.member:
                self.leases.release(loop.member)
        frame = sys._current_frames().get(ident)
        where = f" at {frame.f_code.co_filename}:{frame.f_lineno}" if frame else ""
        self.request_recycle(f"job {job_name} is stuck past its timeout{where}")

    # Signals ------------------------------------------------------------------------------
    def request_stop(self, signum: int, frame: Any) -> None:
        # No lock: this runs on the main thread between two of its bytecodes, maybe while that
        # thread holds self._lock (tally), which would wait for itself forever. An int read is
        # atomic, and the count only words the log line.
        busy = self._busy
        logger.info(
            "worker %s: %s received: %s, then stopping (a second signal stops at once)",
            self.name,
            signal.Signals(signum).name,
            f"finishing the running job{'s' if busy > 1 else ''}" if busy else "no job running",
        )
        self._shutdown_requested_date: datetime = rq_now()
        self._stop_requested = True
        signal.signal(signal.SIGINT, self.request_force_stop)
        signal.signal(signal.SIGTERM, self.request_force_stop)

    def unsubscribe(self) -> None:
        """RQ's, with the running flag of its command listener thread cleared before the
        UNSUBSCRIBE whose reply wakes that thread. In RQ's order the thread could take the reply
        first and wait for a message again (up to 60 s): the stop then waited out RQ's join of
        1 s (redis-py 8.1) or the whole 60 s (8.2, whose ``stop()`` joins the thread). Not
        ``stop()`` itself here: on 8.2 it waits for the thread, which only the reply wakes."""
        running = getattr(self.pubsub_thread, "_running", None)
        if isinstance(running, threading.Event):
            running.clear()
        super().unsubscribe()  # type: ignore[no-untyped-call]

    def _log_banner(self, burst: bool, max_jobs: int | None) -> None:
        from django.db import router

        from kumiko_jobs.database_ready import description
        from kumiko_jobs.models import JobRun

        logger.info(
            "worker %s (pid %d) consuming lane %s (queue %s, prefix %r) on Redis %s, database %s; "
            "%d thread%s, scheduler %s%s%s",
            self.name,
            os.getpid(),
            self.lane,
            self.keys.queue_name(self.lane),
            self.keys.prefix,
            redis_description(),
            description(router.db_for_write(JobRun)),
            self.threads,
            "s" if self.threads > 1 else "",
            "on" if self.schedule else "off (--no-scheduler)",
            ", burst" if burst else "",
            f", at most {max_jobs} jobs" if max_jobs else "",
        )
