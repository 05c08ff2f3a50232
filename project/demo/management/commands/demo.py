"""``manage.py demo [--once] [--jobs N] [--port 8000]``: kumiko_jobs end to end on one machine.

Starts a worker per lane, dispatches a scripted mix of jobs for every tenant, shows their
progress and a per-tenant summary, then serves the admin's run browser until Ctrl-C
(or, with ``--once``, exits: 0 when every run ended as expected).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError
from rich.console import Console
from rich.markup import escape

from kumiko_jobs.conf import redis_url
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.keys import LANES
from kumiko_jobs.observability import flush_telemetry
from project import telemetry
from project.demo import housekeeping, processes, progress, scenario
from project.demo.models import Tenant
from project.demo.processes import Child

RUN_BROWSER_PATH = "/admin/kumiko_jobs/jobrun/"
CONSOLE_PATH = "/admin/kumiko_jobs/consoleoverview/"
SHOWN_PROBLEMS = 10


def positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return int(value)


class Command(BaseCommand):
    help = (
        "Run the kumiko_jobs demo: two lane workers, a mix of jobs across the demo tenants, a "
        "per-tenant summary, then the admin until Ctrl-C (--once: exit after the summary)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Exit after the summary (non-zero if wrong).")
        parser.add_argument(
            "--jobs", type=positive_int, default=60, help="How many runs to dispatch (default 60)."
        )
        parser.add_argument(
            "--port", type=positive_int, default=8000, help="Port of the admin (default 8000)."
        )
        parser.add_argument(
            "--timeout",
            type=float,
            default=60.0,
            help="Seconds to wait for every run to finish (default 60).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        console = Console(highlight=False)
        once, port = bool(options["once"]), int(options["port"])
        tenants = self._check_preconditions(int(options["jobs"]), None if once else port)
        keys, runs = housekeeping.clear_previous_demo()
        if keys or runs:
            console.print(f"Starting clean: deleted {runs} old demo runs and {keys} Redis keys.")
        login = housekeeping.ensure_admin_login()
        # SIGTERM takes the Ctrl-C path, so the workers are stopped either way.
        previous_handler = signal.signal(signal.SIGTERM, signal.default_int_handler)
        workers: list[Child] = []
        # This process's console spans go to a file: on stdout they would garble the progress bars.
        spans = _log_path("spans").open("w")
        telemetry.console_to(spans)
        try:
            workers = [
                processes.start(
                    f"{lane} worker", ["runjobs", "--lane", lane], _log_path(lane), _metrics_env(index)
                )
                for index, lane in enumerate(LANES)
            ]
            console.print(
                f"Started {len(workers)} workers (pids {', '.join(str(w.process.pid) for w in workers)})."
            )
            problems = self._run_scenario(
                console, tenants, int(options["jobs"]), float(options["timeout"]), workers
            )
            console.print(f"Admin: http://127.0.0.1:{port}{RUN_BROWSER_PATH}")
            console.print(f"Console: http://127.0.0.1:{port}{CONSOLE_PATH}")
            console.print(
                f"A tenant's own jobs page: http://127.0.0.1:{port}/tenants/{tenants[0].slug}/jobs/"
            )
            how = "created" if login.created else "password reset"
            console.print(f"Login: {login.username} / {login.password}  ({how})")
            if once:
                if problems:
                    raise CommandError(
                        f"{len(problems)} runs did not end as expected (listed above).", returncode=1
                    )
                return
            self._serve(console, port)
        except KeyboardInterrupt:
            console.print("Interrupted: stopping.")
            if once:
                raise CommandError("Interrupted.", returncode=130) from None
        finally:
            self._stop(console, workers)
            signal.signal(signal.SIGTERM, previous_handler)
            flush_telemetry()
            telemetry.console_to(None)
            spans.close()

    def _check_preconditions(self, jobs: int, port: int | None) -> list[Tenant]:
        """The active tenants, once everything the demo needs is known to be there."""
        try:
            tenants = list(Tenant.objects.filter(active=True).order_by("pk"))
        except DatabaseError as exc:
            raise CommandError(f"Cannot read the tenants ({exc}). Run `python manage.py migrate`.") from exc
        if not tenants:
            raise CommandError(
                "No active demo tenants. Run `python manage.py migrate` (migration demo.0002 creates them)."
            )
        if jobs < scenario.min_jobs(len(tenants)):
            raise CommandError(
                f"--jobs must be at least {scenario.min_jobs(len(tenants))}: one run of each of the "
                f"{len(scenario.KINDS)} kinds for each of the {len(tenants)} tenants."
            )
        try:
            get_redis().ping()
        except redis.RedisError as exc:
            raise CommandError(
                f"Redis at {redis_url()} is not reachable ({exc}). Start it or set KUMIKO_REDIS_URL."
            ) from exc
        others = housekeeping.running_workers()
        if others:
            # Starting clean deletes this prefix's Redis state, which would pull jobs from under them.
            raise CommandError(
                f"Workers already consume the lanes of prefix {get_keys().prefix!r}: {', '.join(others)}. "
                "Stop them first (a demo still serving the admin? press Ctrl-C there), or set another "
                "KUMIKO_QUEUE_PREFIX. A killed worker's registration expires by itself within a minute."
            )
        if port is not None and not _port_free(port):
            raise CommandError(f"Port {port} on 127.0.0.1 is in use; pick another with --port.")
        return tenants

    def _run_scenario(
        self, console: Console, tenants: list[Tenant], jobs: int, timeout: float, workers: list[Child]
    ) -> list[str]:
        batch = f"demo-{uuid.uuid4().hex[:8]}"
        planned = scenario.plan(tenants, jobs)
        console.print(f"Dispatching {len(planned)} runs for {len(tenants)} tenants (notes tagged {batch}).")
        started = time.monotonic()
        try:
            with progress.progress_bars(console) as bars:
                task = bars.add_task("", total=len(planned), label="dispatched")
                runs = scenario.dispatch_planned(planned, batch, lambda: bars.advance(task))
                run_ids = [run.run_id for run in runs]
                records = progress.wait_until_final(bars, run_ids, timeout, lambda: _alive(workers))
        except progress.UnfinishedRunsError as exc:
            raise CommandError(
                f"Timed out after {timeout:g}s with runs unfinished ({exc}). Worker logs: "
                f"{', '.join(str(w.log_path) for w in workers)}. A slow machine may need --timeout.",
                returncode=1,
            ) from None
        title = f"Runs per tenant ({len(runs)} runs in {time.monotonic() - started:.1f}s)"
        console.print(progress.runs_per_tenant(tenants, records, title))
        problems = scenario.unexpected_outcomes(runs, records, batch, planned=len(planned))
        if problems:
            console.print(f"[bold red]{len(problems)} runs did not end as expected:[/]")
            for problem in problems[:SHOWN_PROBLEMS]:
                console.print(f"  - {escape(problem)}")
        else:
            console.print(
                "[green]Every run ended as expected:[/] quick, api and event jobs and the Django task "
                "succeeded, flaky ones "
                f"on attempt {scenario.EXPECTED['flaky'].attempt}, always-failing ones failed after a retry."
            )
        console.print(f"Worker logs: {', '.join(str(w.log_path) for w in workers)}")
        console.print(f"Spans of this process: {_log_path('spans')} (the workers' are in their logs)")
        ports = [w.metrics_port for w in workers if w.metrics_port]
        if ports:
            console.print(f"Prometheus metrics of the workers: {', '.join(f'127.0.0.1:{p}' for p in ports)}")
        return problems

    def _serve(self, console: Console, port: int) -> None:
        console.print(f"Serving the admin on http://127.0.0.1:{port}/admin/ - press Ctrl-C to stop.")
        server = processes.start("admin server", ["runserver", "--noreload", f"127.0.0.1:{port}"])
        try:
            code = server.process.wait()
        finally:
            processes.stop_all([server])
        raise CommandError(f"The admin server exited with code {code}.", returncode=code or 1)

    def _stop(self, console: Console, workers: list[Child]) -> None:
        if not workers:
            return
        killed = processes.stop_all(workers)
        if killed:
            console.print(
                f"[yellow]Killed {', '.join(killed)}: no exit within {processes.STOP_GRACE_SECONDS:g}s.[/]"
            )
        else:
            console.print("Workers stopped.")


def _alive(workers: list[Child]) -> None:
    for worker in workers:
        code = worker.exited()
        if code is not None:
            raise CommandError(
                f"The {worker.name} exited with code {code}. Its last lines:\n{worker.log_tail()}"
            )


def _metrics_env(index: int) -> dict[str, str]:
    """Each worker serves its Prometheus metrics on its own port (9464, 9465, ... by default)."""
    if not telemetry.prometheus_enabled():
        return {}
    port = int(os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464")) + index
    return {"OTEL_EXPORTER_PROMETHEUS_PORT": str(port)} if _port_free(port) else {}


def _log_path(lane: str) -> Path:
    # Worker output would garble the progress bar; it goes to a file named in the summary.
    return Path(tempfile.gettempdir()) / f"kumiko-demo-{get_keys().id_tag}-{lane}.log"


def _port_free(port: int) -> bool:
    # runserver binds with SO_REUSEADDR too, so a port in TIME_WAIT counts as free.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
