"""The supervisor's pieces that need no worker processes: its children's command line, how it
reads a process's resident memory, and how its loop treats children that exited (real child
processes of a one-line Python program)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kumiko_jobs.supervisor import (
    EXIT_RECYCLE,
    MAX_STARTUP_FAILURES,
    Child,
    Supervisor,
    _resident_from_proc,
    _resident_from_ps,
    child_command,
)


def test_both_ways_of_reading_resident_memory_agree_on_this_process() -> None:
    """--max-memory reads /proc on Linux and asks ``ps`` elsewhere (macOS): both must give the
    same figure, in bytes."""
    ballast = b"x" * (64 * 2**20)  # resident, so both see well above an interpreter's size
    from_proc, from_ps = _resident_from_proc(os.getpid()), _resident_from_ps(os.getpid())
    assert from_proc is not None and from_ps is not None
    assert from_proc > 64 * 2**20
    assert abs(from_proc - from_ps) < 8 * 2**20, (from_proc, from_ps)
    del ballast


def test_a_process_that_is_gone_has_no_resident_memory() -> None:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    assert _resident_from_proc(finished.pid) is None
    assert _resident_from_ps(finished.pid) is None


def test_children_get_the_command_line_without_the_supervisors_options_and_a_name_per_slot() -> None:
    argv = ["manage.py", "runjobs", "--lane", "worker", "--processes", "3", "--max-memory=400",
            "--threads", "4", "--name", "box"]  # fmt: skip
    assert child_command(argv, 2) == [
        sys.executable, "manage.py", "runjobs", "--lane", "worker", "--threads", "4", "--name", "box-p2",
    ]  # fmt: skip


SLEEPER = ["-c", "import time; time.sleep(60)"]


def _ended(code: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    proc.wait()
    return proc


def test_a_child_in_backoff_does_not_keep_a_failed_supervisor_running() -> None:
    """Slot 1 dies at start-up for the fifth time while slot 2 waits out its own backoff: the
    supervisor stops everything and its loop ends (before, slot 2 stayed listed, waiting for a
    restart that stopping forbade, and the supervisor never exited 1)."""
    supervisor = Supervisor(2, SLEEPER, max_memory_mb=None, burst=False)
    now = time.monotonic()
    supervisor.children = [
        Child(1, _ended(3), started=now, failures=MAX_STARTUP_FAILURES - 1),
        Child(2, _ended(3), started=now, failures=1, restart_at=now + 100),
    ]
    supervisor._tend()
    assert supervisor.failed.startswith(f"worker process 1 died {MAX_STARTUP_FAILURES} times")
    supervisor._tend()
    assert supervisor.children == []  # run() returns 1 once the list is empty


def test_signals_are_acted_on_by_the_loop_not_in_the_handler() -> None:
    """A signal handler only notes the signal: one that came while the children were being
    started signalled none of them before."""
    supervisor = Supervisor(1, SLEEPER, max_memory_mb=None, burst=False)
    supervisor._note_signal(signal.SIGTERM, None)  # as if it came during the first spawn
    supervisor.children = [supervisor._start(1)]
    child = supervisor.children[0].proc
    try:
        assert child.poll() is None and not supervisor.stopping
        supervisor._act_on_signals()
        assert supervisor.stopping
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


def test_a_child_that_asks_for_its_replacement_is_restarted_at_once_without_counting_a_failure() -> None:
    supervisor = Supervisor(1, SLEEPER, max_memory_mb=None, burst=False)
    now = time.monotonic()
    child = Child(1, _ended(EXIT_RECYCLE), started=now, failures=2)
    supervisor.children = [child]
    supervisor._tend()
    assert (child.failures, child.restart_at) == (0, pytest.approx(now, abs=1))
