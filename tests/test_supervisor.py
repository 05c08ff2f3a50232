"""The supervisor's pieces that need no worker processes: its children's command line and how it
reads a process's resident memory."""

from __future__ import annotations

import os
import subprocess
import sys

from kumiko_jobs.supervisor import _resident_from_proc, _resident_from_ps, child_command


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
