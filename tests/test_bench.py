"""Smoke test of the benchmarks: ``python -m bench --quick`` runs end to end and reports every row.

Only that it runs and what it reports are checked, never how fast: timings on a shared machine
are not a pass/fail matter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from kumiko_jobs.conf import redis_url

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
ROWS = (
    "dispatch()",
    "rq Queue.enqueue",
    "runjobs --lane worker",
    "rq SimpleWorker",
    "rq Worker (fork per job)",
    "dispatch() / rq Queue.enqueue",
    "runjobs / rq SimpleWorker",
    "runjobs / rq Worker (fork)",
    "dispatch() (enqueue side)",
    "runjobs (worker side)",
    "leader cost per tick (tz=tenant)",
    "zone index rebuild",
    "cpus (nproc)",
    "redis-server",
    "database",
)


def test_quick_bench_reports_every_row_and_cleans_up(kumiko_prefix: str, redis_client: redis.Redis) -> None:
    env = {**os.environ, "KUMIKO_REDIS_URL": redis_url()}
    # The bench migrates a temporary SQLite database of its own; the test database stays untouched.
    env.pop("DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--prefix", kumiko_prefix],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    missing = [row for row in ROWS if row not in result.stdout]
    assert not missing, result.stdout
    assert not list(redis_client.scan_iter(match=f"*{kumiko_prefix}*"))
