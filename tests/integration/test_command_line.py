"""End to end: ``runjobs`` refuses bad options, an unreachable Redis or database and an
unmigrated database with a clear message, before it writes anything."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

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
        (["--lane", "worker", "--threads", "0"], "argument --threads: must be >= 1, got 0"),
        (
            ["--lane", "worker", "--threads", "257"],
            "argument --threads: at most 256 threads a process, got 257; add --processes for more",
        ),
        # Abbreviations are refused: a child would read "--proc 4", which the supervisor does not
        # strip, as --processes 4 and start a supervisor of its own.
        (["--lane", "worker", "--proc", "4"], "unrecognized arguments: --proc 4"),
        (["--lane", "worker", "--max-mem=500"], "unrecognized arguments: --max-mem=500"),
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


def test_unreachable_database_stops_start_up(
    runjobs_env: dict[str, str], redis_client: redis.Redis, kumiko_prefix: str
) -> None:
    env = {**runjobs_env, "DATABASE_URL": "postgres://postgres@127.0.0.1:1/kumiko_absent"}

    code, output, seconds = _runjobs(env, "--lane", "worker", "--burst")

    assert code != 0
    assert "database 'default' (postgresql:kumiko_absent) is not reachable" in output
    assert "DATABASES['default']" in output
    assert "Traceback" not in output
    assert seconds < 15
    assert not redis_client.keys(f"*{kumiko_prefix}*")  # no worker registered, no job pushed


def _manage(env: dict[str, str], *args: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=env,
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip


def test_unmigrated_database_stops_start_up_naming_the_missing_migrations(
    runjobs_env: dict[str, str], redis_client: redis.Redis, kumiko_prefix: str, tmp_path: Path
) -> None:
    migrations = sorted(p.stem for p in (REPO_ROOT / "kumiko_jobs" / "migrations").glob("[0-9]*.py"))
    env = {**runjobs_env, "DATABASE_URL": f"sqlite:///{tmp_path / 'new.sqlite3'}"}

    code, output, _ = _runjobs(env, "--lane", "worker", "--burst")

    assert code != 0
    assert f"lacks {len(migrations)} migration(s) kumiko_jobs needs (kumiko_jobs.0001_initial," in output
    assert "Run `manage.py migrate` before starting workers." in output
    assert "Traceback" not in output
    assert not redis_client.keys(f"*{kumiko_prefix}*")

    # A deploy that started the new code's workers before its migration: the one missing is named.
    _manage(env, "migrate", "--noinput")
    _manage(env, "migrate", "kumiko_jobs", migrations[-2], "--noinput")
    code, output, _ = _runjobs(env, "--lane", "worker", "--burst")

    assert code != 0
    assert f"lacks 1 migration(s) kumiko_jobs needs (kumiko_jobs.{migrations[-1]})" in output

    _manage(env, "migrate", "--noinput")
    code, output, _ = _runjobs(env, "--lane", "worker", "--burst")

    assert code == 0, output
    assert "stopped after 0 jobs" in output
