"""``manage.py runjobs --lane worker|api``: run one lane worker until SIGTERM."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser

from kumiko_jobs import worker_logging
from kumiko_jobs.conf import redis_description
from kumiko_jobs.connection import get_redis
from kumiko_jobs.definitions import LANES


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
            help="Do not promote delayed jobs or fire schedules in this process (pure executor).",
        )
        parser.add_argument("--name", default=None, help="Worker name (default: generated).")
        parser.add_argument(
            "--threads",
            type=positive_int,
            default=1,
            help="Job threads in the process (default 1); each has its own database connection.",
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
        if options["processes"] > 1 or options["max_memory"]:
            from kumiko_jobs.supervisor import supervise

            code = supervise(
                options["processes"],
                sys.orig_argv[1:],
                max_memory_mb=options["max_memory"],
                burst=options["burst"],
            )
            raise SystemExit(code)
        worker = LaneWorker(
            options["lane"],
            name=options["name"],
            schedule=not options["no_scheduler"],
            threads=options["threads"],
        )
        # RQ's own start-up lines repeat our banner; they show at -v 3 only.
        rq_level = "DEBUG" if verbosity >= 3 else "WARNING"
        worker.work(burst=options["burst"], max_jobs=options["max_jobs"], logging_level=rq_level)
