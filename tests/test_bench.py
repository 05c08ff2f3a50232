"""Smoke test of the benchmarks: ``python -m bench --quick`` runs end to end and reports every row.

Only that it runs and what it reports are checked, never how fast: timings on a shared machine
are not a pass/fail matter.
"""

from __future__ import annotations

import os
import re
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
    "trivial: Dramatiq 1x8",
    "trivial: Celery threads 8",
    "20 ms: Dramatiq 1x8",
    "20 ms: Celery threads 8",
    "20 ms: rq SimpleWorker",
    "runjobs, no OpenTelemetry SDK",
    "runjobs, SDK without exporter",
    "runjobs, SDK exporting",
    "runjobs CPU per job: without SDK / with SDK (no exporter)",
)
# runjobs' rows name its concurrency: 1x8 once it has --threads, else one thread, said so in
# the rate rows (whose label cell ends there: "\s+│").
RUNJOBS = r"runjobs (1x8|1 thread)"
RUNJOBS_RATE = r"runjobs (1x8|\(1 thread: --threads not available yet\))\s+│"
PEER_ROWS = (
    rf"trivial: {RUNJOBS_RATE}",
    rf"20 ms: {RUNJOBS_RATE}",
    rf"trivial: {RUNJOBS} / Dramatiq 1x8 ",
    rf"trivial: {RUNJOBS} / Celery threads 8 ",
    rf"20 ms: {RUNJOBS} jobs/s ",
    rf"20 ms: {RUNJOBS} / Dramatiq 1x8 ",
    rf"20 ms: {RUNJOBS} / Celery threads 8 ",
    rf"20 ms: {RUNJOBS} / rq SimpleWorker ",
)
# Where Dramatiq and Celery put their keys by default: the bench must have namespaced them all.
PEER_DEFAULT_KEYS = ("dramatiq:*", "celery*", "_kombu.*", "unacked*")


def _peer_default_keys(client: redis.Redis) -> set[bytes]:
    return {key for pattern in PEER_DEFAULT_KEYS for key in client.scan_iter(match=pattern, count=1000)}


def test_quick_bench_reports_every_row_and_cleans_up(kumiko_prefix: str, redis_client: redis.Redis) -> None:
    env = {**os.environ, "KUMIKO_REDIS_URL": redis_url()}
    foreign_before = _peer_default_keys(redis_client)
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
    missing += [row for row in PEER_ROWS if not re.search(row, result.stdout)]
    assert not missing, result.stdout
    assert not list(redis_client.scan_iter(match=f"*{kumiko_prefix}*"))
    assert _peer_default_keys(redis_client) - foreign_before == set()


def test_runjobs_concurrency_follows_its_help_text() -> None:
    from bench.peer_rates import concurrency_from_help

    current = subprocess.run(
        [sys.executable, "manage.py", "runjobs", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    ours = concurrency_from_help(current)
    if "--threads" in current:
        assert (ours.args, ours.threads, ours.name) == (("--threads", "8"), 8, "runjobs 1x8")
    else:
        assert (ours.args, ours.threads) == ((), 1)
        assert ours.label == "runjobs (1 thread: --threads not available yet)"
    threaded = concurrency_from_help(current + "\n  -t N, --threads N   Threads per process.\n")
    assert (threaded.args, threaded.threads, threaded.label) == (("--threads", "8"), 8, "runjobs 1x8")
    assert concurrency_from_help("  --no-threads   Never.\n").threads == 1
