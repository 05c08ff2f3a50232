"""Child processes the bench leaves running while it works (serving workers, peers' workers),
and the ``runjobs`` command lines it starts.

``running(env, argv)`` starts ``python ARGV`` with the bench's environment, its output in a
temporary file that error messages quote, and stops it on leaving the block. Children that run
to their end (burst workers) go through ``BenchEnv.run_child`` instead.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

from bench.environment import ROOT, BenchEnv, BenchError

T = TypeVar("T")

# -v 0: kumiko_jobs and RQ log at WARNING, like the RQ baselines; bench/settings.py keeps the
# worker's few per-process lines (banner, shutdown) at INFO, for the connection count.
RUNJOBS = ("manage.py", "runjobs", "--lane", "worker", "--burst", "-v", "0")
# A worker that keeps running (e.g. the quiet tenant's run is dispatched while it works).
RUNJOBS_SERVING = tuple(arg for arg in RUNJOBS if arg != "--burst")
_CONNECTIONS = re.compile(rb"database connections opened: (\d+)")


def connections_opened(output: bytes) -> list[int]:
    """The database connections each worker process opened, from its shutdown line(s)."""
    return [int(found) for found in _CONNECTIONS.findall(output)]


class Child:
    """A child process left running while the bench works; its output goes to a temporary file
    that error messages quote."""

    def __init__(self, env: BenchEnv, argv: Sequence[str]) -> None:
        self.env, self.argv = env, argv
        self.output = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, *argv],
            cwd=ROOT,
            env=env.child_env(),
            stdout=self.output,
            stderr=subprocess.STDOUT,
        )
        env.children.append(self.process)

    def check(self) -> None:
        if self.process.poll() is not None:
            command = " ".join(self.argv)
            raise BenchError(f"{command} exited {self.process.returncode}; its output:\n{self.tail()}")

    def wait_for(self, probe: Callable[[], T | None], timeout: float, what: str) -> T:
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:  # None and False: not yet
                return value
            self.check()
            if time.monotonic() > deadline:
                command = " ".join(self.argv)
                raise BenchError(f"waited {timeout:.0f}s for {what}; {command} said:\n{self.tail()}")
            time.sleep(0.01)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """SIGSTOP for the block, SIGCONT after: the child keeps its start-up, caches and
        connections while the bench prepares its next piece of work."""
        self.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.process.send_signal(signal.SIGCONT)

    def tail(self) -> str:
        self.output.seek(0)
        return self.output.read().decode(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # every worker the bench runs finishes the jobs in hand, then exits
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.env.children.remove(self.process)
        self.output.close()


@contextmanager
def running(env: BenchEnv, argv: Sequence[str]) -> Iterator[Child]:
    child = Child(env, argv)
    try:
        yield child
    finally:
        child.stop()
