"""Crash points for the chaos tests: ``KUMIKO_CRASH_AT=<name>`` makes the process SIGKILL itself
when it reaches that point (a machine losing power there, as far as Redis and the database can
tell). Inert, and one string comparison, unless the variable is set at start-up."""

from __future__ import annotations

import os
import signal

_CRASH_AT = os.environ.get("KUMIKO_CRASH_AT", "")


def crash_point(name: str) -> None:
    if _CRASH_AT and name == _CRASH_AT:
        os.kill(os.getpid(), signal.SIGKILL)
