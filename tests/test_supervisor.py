"""The supervisor's pieces that need no worker processes: its children's command line, how it
reads a process's resident memory, and how its loop treats children that exited (real child
processes of a one-line Python program)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


@pytest.mark.parametrize(
    "options",
    [
        ["--processes", "3", "--max-memory", "400", "--name", "box"],
        ["--processes=3", "--max-memory=400", "--name=box"],
        ["--name", "other", "--processes=3", "--name=box"],  # the last --name wins, as in argparse
    ],
)
def test_an_option_given_with_an_equals_sign_is_read_as_one_given_apart(options: list[str]) -> None:
    """``--name=box`` stayed on the child's command line before, followed by the generated
    ``--name <host>-<pid>-p2``, which argparse took: the children lost the name given."""
    argv = ["manage.py", "runjobs", "--lane=worker", "--max-jobs=5", *options]
    assert child_command(argv, 2) == [
        sys.executable, "manage.py", "runjobs", "--lane=worker", "--max-jobs=5", "--name", "box-p2",
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
    supervisor = Supervisor(2, SLEEPER, gated_lane="worker", max_memory_mb=None, burst=False)
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
    supervisor = Supervisor(1, SLEEPER, gated_lane="worker", max_memory_mb=None, burst=False)
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
    supervisor = Supervisor(1, SLEEPER, gated_lane="worker", max_memory_mb=None, burst=False)
    now = time.monotonic()
    child = Child(1, _ended(EXIT_RECYCLE), started=now, failures=2)
    supervisor.children = [child]
    supervisor._tend()
    assert (child.failures, child.restart_at) == (0, pytest.approx(now, abs=1))


def test_the_children_that_run_the_gated_code_are_told_the_gates_passed_and_no_others(tmp_path: Path) -> None:
    """The first child and its replacement (after --max-jobs, a crash) run the code the
    supervisor passed the gates with; a child started after a SIGHUP (a deploy's reload) runs
    newer code and must pass them itself. Before, the supervisor put the mark into its own
    environment, so every child it ever started inherited it."""
    from kumiko_jobs.supervisor import GATES_PASSED_ENV

    seen = tmp_path / "seen"
    script = f"import os, sys; open(sys.argv[1], 'w').write(os.environ.get({GATES_PASSED_ENV!r}, 'absent'))"
    supervisor = Supervisor(
        1, ["-c", script, str(seen)], gated_lane="worker", max_memory_mb=None, burst=False
    )

    def mark_of_next_child() -> str:
        supervisor._tend()  # the child (which exits at once) is noted as exited: restarted now
        supervisor._tend()
        [child] = supervisor.children
        assert child.proc.wait(timeout=10) == 0
        return seen.read_text()

    supervisor.children = [supervisor._start(1)]
    assert supervisor.children[0].proc.wait(timeout=10) == 0
    assert seen.read_text() == f"worker:{os.getpid()}"
    assert mark_of_next_child() == f"worker:{os.getpid()}"
    supervisor._note_signal(signal.SIGHUP, None)
    supervisor._act_on_signals()
    assert mark_of_next_child() == "absent"
    assert GATES_PASSED_ENV not in os.environ


# A supervised child, with this test's process as its supervisor: it reads the mark, then starts
# two processes of its own, one with its environment and one with a copy taken before the read
# (as a project's settings module may take one, and hand it to the processes its jobs start).
CHILD = """
import os, subprocess, sys
from kumiko_jobs.supervisor import gates_passed_by_supervisor
captured = dict(os.environ)
print(gates_passed_by_supervisor("worker"))
grandchild = "from kumiko_jobs.supervisor import gates_passed_by_supervisor as g; print(g('worker'))"
for environment in (None, captured):
    subprocess.run([sys.executable, "-c", grandchild], env=environment, check=True)
"""


def test_the_gates_mark_counts_in_its_supervisors_child_only_never_in_the_processes_it_starts() -> None:
    """Before, a worker process kept the mark in its environment, so a ``runjobs`` one of its
    jobs started inherited it and skipped its database check and its gates."""
    from kumiko_jobs.supervisor import GATES_PASSED_ENV

    environment = {**os.environ, GATES_PASSED_ENV: f"worker:{os.getpid()}"}
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=environment,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    # The child's own read; then none inherited, and the copy names a process that is not the
    # grandchild's parent.
    assert child.stdout.split() == ["True", "False", "False"]
