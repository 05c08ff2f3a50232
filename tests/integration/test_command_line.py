"""End to end: ``runjobs`` refuses bad options and an unreachable Redis with a clear message."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.integration.support import REPO_ROOT

pytestmark = pytest.mark.slow


def _runjobs(env: dict[str, str], *args: str) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "manage.py", "runjobs", *args], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lane", "both"], "argument --lane: invalid choice: 'both'"),
        ([], "the following arguments are required: --lane"),
        (["--lane", "worker", "--max-jobs", "0"], "argument --max-jobs: must be >= 1, got 0"),
        (["--lane", "worker", "--max-jobs", "x"], "argument --max-jobs: 'x' is not an integer"),
    ],
)
def test_bad_options_are_usage_errors(runjobs_env: dict[str, str], args: list[str], message: str) -> None:
    code, output, _ = _runjobs(runjobs_env, *args)

    assert code != 0
    assert message in output
    assert "Traceback" not in output


def test_unreachable_redis_stops_start_up_quickly(runjobs_env: dict[str, str]) -> None:
    env = {**runjobs_env, "KUMIKO_REDIS_URL": "redis://127.0.0.1:1/0"}

    code, output, seconds = _runjobs(env, "--lane", "worker")

    assert code != 0
    assert "Redis at redis://127.0.0.1:1/0 is not reachable" in output
    assert "Traceback" not in output
    assert seconds < 15
