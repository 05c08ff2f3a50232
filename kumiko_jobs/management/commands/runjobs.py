"""``manage.py runjobs --lane worker|api``: run one lane worker until SIGTERM.

Start-up order: Redis reachable (else fail within REDIS_TIMEOUT; a supervisor's child waits for
it instead, since its supervisor reached it), the database reachable and
migrated (database_ready.py; else fail at once), the lane's boot gates inline
(exit status 3 on failure), its boot jobs (once per dataset and release), then the scheduler
thread (stamps; leader election unless --no-scheduler) and the worker loop. With --processes
the supervisor passes the gates once, before it starts any child (the children a SIGHUP starts,
with newer code, pass them again themselves); each child runs a scheduler thread of its own
(they elect one leader among them and every other process of the lane).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from kumiko_jobs import worker_logging
from kumiko_jobs.conf import redis_description
from kumiko_jobs.connection import get_redis
from kumiko_jobs.definitions import LANES

# Job threads a process may run. Past it, a typo (--threads 10000) failed halfway through
# start-up with "can't start new thread". Each thread holds a database connection of its own and
# all share one GIL, so well before it more work wants --processes.
MAX_THREADS = 256


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def thread_count(value: str) -> int:
    number = positive_int(value)
    if number > MAX_THREADS:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_THREADS} threads a process, got {number}; add --processes for more"
        )
    return number


class Command(BaseCommand):
    help = (
        "Run a kumiko_jobs worker for one lane (api or worker). SIGTERM finishes the current job, then exits."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # No abbreviated options: the supervisor strips its own options from its children's
        # command line by their full names, so a child given "--proc 4" would read it as
        # --processes 4 and start a supervisor of its own, and so on (a fork bomb).
        return super().create_parser(prog_name, subcommand, allow_abbrev=False, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--lane", required=True, choices=LANES, help="The lane to consume.")
        parser.add_argument("--burst", action="store_true", help="Exit when no job is queued or due.")
        parser.add_argument("--max-jobs", type=positive_int, default=None, help="Exit after N jobs.")
        parser.add_argument(
            "--no-scheduler",
            action="store_true",
            help="Never lead the lane's schedules and do not promote delayed jobs (pure executor).",
        )
        parser.add_argument("--name", default=None, help="Worker name (default: generated).")
        parser.add_argument(
            "--threads",
            type=thread_count,
            default=1,
            help=(
                f"Job threads in the process (default 1, at most {MAX_THREADS}); each has its own "
                "database connection."
            ),
        )
        parser.add_argument(
            "--processes",
            type=positive_int,
            default=1,
            help="Worker processes to run and supervise (default 1: this process is the worker).",
        )
        parser.add_argument(
            "--max-memory",
            type=positive_int,
            default=None,
            metavar="MB",
            help="With --processes: recycle a worker process whose resident memory exceeds MB.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from kumiko_jobs.database_ready import database_problem
        from kumiko_jobs.scheduling.boot_jobs import dispatch_boot_jobs
        from kumiko_jobs.scheduling.loop import SchedulerThread
        from kumiko_jobs.supervisor import EXIT_MAX_JOBS, gates_passed_by_supervisor, watch_supervisor
        from kumiko_jobs.worker import LaneWorker

        verbosity = int(options["verbosity"])
        worker_logging.configure(verbosity)
        supervised = watch_supervisor()
        lane = options["lane"]
        # Removed at once, also in a process that goes on to supervise: nothing it starts inherits it.
        gates_passed = gates_passed_by_supervisor(lane)
        self._reach_redis(waiting=supervised, worker=options["name"] or "")
        # A supervisor's children: their supervisor checked (each child's start-up counts).
        if not gates_passed:
            if problem := database_problem():
                raise CommandError(problem)
            self._pass_boot_gates(lane, options["name"] or f"{os.uname().nodename}-{os.getpid()}")
        dispatch_boot_jobs(lane)
        if options["processes"] > 1 or options["max_memory"]:
            from kumiko_jobs.supervisor import supervise

            # The supervisor writes nothing more; its connection would sit idle for its life.
            connections.close_all()
            code = supervise(
                options["processes"],
                sys.orig_argv[1:],
                gated_lane=lane,  # the gates passed here: its children take jobs at once
                max_memory_mb=options["max_memory"],
                burst=options["burst"],
            )
            raise SystemExit(code)
        worker = LaneWorker(
            lane,
            name=options["name"],
            schedule=not options["no_scheduler"],
            threads=options["threads"],
        )
        scheduler = SchedulerThread(lane, worker.name, lead=not options["no_scheduler"])
        scheduler.start()
        # RQ's own start-up lines repeat our banner; they show at -v 3 only.
        rq_level = "DEBUG" if verbosity >= 3 else "WARNING"
        try:
            worker.work(burst=options["burst"], max_jobs=options["max_jobs"], logging_level=rq_level)
        finally:
            scheduler.stop()
        if supervised and worker.ran_max_jobs():
            # Not 0: under --burst the supervisor would take that for an empty lane.
            raise SystemExit(EXIT_MAX_JOBS)

    @staticmethod
    def _reach_redis(*, waiting: bool, worker: str) -> None:
        """Fail at once if Redis does not answer (a wrong setting, most likely), or, ``waiting``
        (a supervisor's child: its supervisor reached Redis with these very settings), wait the
        outage out as a running worker does; a child failing at once would count as a broken
        deploy and take the supervisor down."""
        from kumiko_jobs.outage import RedisOutage

        outage = RedisOutage(worker)
        while True:
            try:
                get_redis().ping()
            except redis.RedisError as exc:
                if not waiting:
                    raise CommandError(
                        f"Redis at {redis_description()} is not reachable ({exc}). "
                        "Start Redis or set KUMIKO_JOBS['REDIS']."
                    ) from exc
                outage.wait(exc)
                continue
            outage.over()
            return

    def _pass_boot_gates(self, lane: str, worker: str) -> None:
        """Run the lane's boot gates; exit with status 3 and ``boot gate <name> failed:
        <reason>`` on stderr if one fails."""
        from kumiko_jobs.exceptions import BootGateFailed
        from kumiko_jobs.scheduling.boot_gates import run_boot_gates
        from kumiko_jobs.supervisor import EXIT_BOOT_GATE_FAILED

        try:
            run_boot_gates(lane, worker=worker)
        except BootGateFailed as exc:
            self.stderr.write(str(exc), style_func=lambda text: text)
            raise SystemExit(EXIT_BOOT_GATE_FAILED) from exc
