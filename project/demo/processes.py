"""Child processes of the demo: ``manage.py`` subcommands started and stopped as a group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from django.conf import settings

STOP_GRACE_SECONDS = 10.0


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path | None = None
    metrics_port: int | None = None

    def exited(self) -> int | None:
        return self.process.poll()

    def log_tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def manage_py_command(*args: str) -> list[str]:
    # The same interpreter and project as this process, whichever venv started it.
    return [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), *args]


def child_env() -> dict[str, str]:
    # Children must use this process's settings (tests.settings in the test suite) and database.
    return {**os.environ, "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE, "PYTHONUNBUFFERED": "1"}


def start(
    name: str, args: Sequence[str], log_path: Path | None = None, env: Mapping[str, str] | None = None
) -> Child:
    """Start ``manage.py <args>``; output goes to ``log_path`` (or this terminal if None).

    Each child gets its own process group so the terminal's Ctrl-C reaches only the demo,
    which then stops the children in order: a second signal would turn a worker's graceful
    shutdown into a hard one.
    """
    output: IO[bytes] | None = log_path.open("wb") if log_path is not None else None
    try:
        process = subprocess.Popen(  # noqa: S603  (fixed argv: this interpreter and manage.py)
            manage_py_command(*args), env={**child_env(), **(env or {})}, stdin=subprocess.DEVNULL,
            stdout=output, stderr=subprocess.STDOUT if output else None, process_group=0,
        )  # fmt: skip
    finally:
        if output is not None:
            output.close()  # the child holds its own descriptor
    port = (env or {}).get("OTEL_EXPORTER_PROMETHEUS_PORT")
    return Child(name, process, log_path, int(port) if port else None)


def stop_all(children: Sequence[Child], grace: float = STOP_GRACE_SECONDS) -> list[str]:
    """SIGTERM every child, wait up to ``grace`` seconds in total, SIGKILL the rest.

    Returns the names of the children that had to be killed.
    """
    running = [child for child in children if child.exited() is None]
    for child in running:
        child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    killed: list[str] = []
    for child in running:
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
            killed.append(child.name)
    return killed
