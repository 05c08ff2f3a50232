"""Helpers of the end-to-end tests: real ``manage.py runjobs`` subprocesses and event waits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:
    from kumiko_jobs.models import JobRun

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str = "condition", step: float = 0.02
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(step)


def in_started_registry(client: redis.Redis, run: JobRun) -> bool:
    """Whether Redis still holds the run's job as started: a worker claimed it and its lane step
    has not yet said how it ended (members are RQ's ``job_id:execution_id``)."""
    from kumiko_jobs.connection import get_keys
    from kumiko_jobs.keys import started_job_id

    members = client.zscan_iter(get_keys().started(run.lane), match=f"{run.job_id}*")
    return any(started_job_id(member) == run.job_id for member, _ in members)


def holds_for(predicate: Callable[[], Any], seconds: float, step: float = 0.05) -> bool:
    """True if ``predicate`` stays truthy for ``seconds`` (for "X does not happen" checks)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(step)
    return bool(predicate())


def database_url(settings_dict: Mapping[str, Any]) -> str:
    """A DATABASE_URL for the database the test process uses (the test database)."""
    engine, name = settings_dict["ENGINE"], settings_dict["NAME"]
    if engine == "django.db.backends.sqlite3":
        return f"sqlite:///{Path(name).resolve()}"
    if engine == "django.db.backends.postgresql":
        auth = settings_dict.get("USER") or ""
        if settings_dict.get("PASSWORD"):
            auth += f":{settings_dict['PASSWORD']}"
        host = settings_dict.get("HOST") or "127.0.0.1"
        port = settings_dict.get("PORT") or 5432
        return f"postgres://{auth}{'@' if auth else ''}{host}:{port}/{name}"
    raise NotImplementedError(f"integration tests do not know how to pass {engine} to a subprocess")


class WorkerProcess:
    """One ``manage.py runjobs`` subprocess in its own process group, output in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self._log = log_path.open("wb")
        # A child inherits an ignored SIGHUP, and runjobs then keeps it ignored (as under nohup).
        # Start it as a service manager does, with SIGHUP at its default, also when the suite
        # itself runs under nohup (the SIGHUP test needs a supervisor that hears it); the test
        # process ignores it again at once, so nohup still protects the suite.
        ignored = signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        if ignored:
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "runjobs", *args], cwd=REPO_ROOT, env=env,
                stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        finally:
            if ignored:
                signal.signal(signal.SIGHUP, signal.SIG_IGN)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_registered(self, client: redis.Redis, claimers_key: str, name: str) -> None:
        """Block until the worker has joined its lane (it is then consuming), or fail."""
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not client.sismember(claimers_key, name):
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"runjobs {self.args} exited with {self.proc.returncode}:\n{self.output()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"runjobs {self.args} did not start in {STARTUP_TIMEOUT}s:\n{self.output()}"
                )
            time.sleep(0.02)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"runjobs {self.args} still runs after {timeout}s:\n{self.output()}"
            ) from None

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def kill_group(self) -> None:
        """SIGKILL the worker and anything it started: a machine crash, as far as Redis can tell."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(STOP_TIMEOUT)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT; always reaps the process and closes the log."""
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    self.kill_group()
            return self.proc.returncode
        finally:
            self._log.close()


def log_messages(run: Any, level: str | None = None) -> list[str]:
    """The messages of a JobRun's log lines, optionally of one level."""
    return [line["msg"] for line in run.logs if level is None or line["level"] == level]


def logged_at(line: str) -> datetime:
    """When a worker wrote this log line, by its own clock (the format of worker_logging.py)."""
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
