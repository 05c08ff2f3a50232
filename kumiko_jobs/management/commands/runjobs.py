"""``manage.py runjobs --lane worker|api``: run one lane worker until SIGTERM.

Start-up order: Redis reachable (else fail within REDIS_TIMEOUT), the lane's boot gates inline
(exit status 3 on failure), its boot jobs (once per dataset and release), then the scheduler
thread (stamps; leader election unless --no-scheduler) and the worker loop.
"""

from __future__ import annotations

import argparse
from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser

from kumiko_jobs import worker_logging
from kumiko_jobs.conf import redis_description
from kumiko_jobs.connection import get_redis
from kumiko_jobs.definitions import LANES

# Exit status when a boot gate fails: distinct from usage errors (1, 2) for deploy scripts.
BOOT_GATE_FAILED = 3


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


class Command(BaseCommand):
    help = (
        "Run a kumiko_jobs worker for one lane (api or worker). SIGTERM finishes the current job, then exits."
    )

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

    def handle(self, *args: Any, **options: Any) -> None:
        from kumiko_jobs.exceptions import BootGateFailed
        from kumiko_jobs.scheduling.boot_gates import run_boot_gates
        from kumiko_jobs.scheduling.boot_jobs import dispatch_boot_jobs
        from kumiko_jobs.scheduling.loop import SchedulerThread
        from kumiko_jobs.worker import LaneWorker

        verbosity = int(options["verbosity"])
        worker_logging.configure(verbosity)
        try:
            get_redis().ping()
        except redis.RedisError as exc:
            raise CommandError(
                f"Redis at {redis_description()} is not reachable ({exc}). "
                "Start Redis or set KUMIKO_JOBS['REDIS']."
            ) from exc
        lane = options["lane"]
        worker = LaneWorker(lane, name=options["name"], schedule=not options["no_scheduler"])
        try:
            run_boot_gates(lane, worker=worker.name)
        except BootGateFailed as exc:
            self.stderr.write(str(exc), style_func=lambda text: text)
            raise SystemExit(BOOT_GATE_FAILED) from exc
        dispatch_boot_jobs(lane)
        scheduler = SchedulerThread(lane, worker.name, lead=not options["no_scheduler"])
        scheduler.start()
        # RQ's own start-up lines repeat our banner; they show at -v 3 only.
        rq_level = "DEBUG" if verbosity >= 3 else "WARNING"
        try:
            worker.work(burst=options["burst"], max_jobs=options["max_jobs"], logging_level=rq_level)
        finally:
            scheduler.stop()
