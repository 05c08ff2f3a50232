"""End to end: what ``runjobs`` prints under Django's default logging, and how many database
connections it opens with Django's default CONN_MAX_AGE."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kumiko_jobs import dispatch

pytestmark = pytest.mark.slow
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"


def test_banner_and_one_line_per_finished_run_without_payloads(
    start_worker: Any, kumiko_prefix: str, tenants: list[Any]
) -> None:
    ok = dispatch("tests.record", {"secret": "s3cr3t-payload"}, tenant=tenants[0])
    bad = dispatch("tests.unrecoverable", {}, tenant=tenants[1])
    worker = start_worker("worker", "--burst", wait=False)
    assert worker.wait(timeout=60) == 0
    output = worker.output()
    name = f"{kumiko_prefix}-worker-1"
    banner = rf"{STAMP} INFO kumiko_jobs\.worker: worker {name} \(pid \d+\) consuming lane worker"
    queue = rf" \(queue {kumiko_prefix}:worker, prefix '{kumiko_prefix}'\) on Redis redis://"
    assert re.search(banner + queue, output)
    assert re.search(
        rf"{STAMP} INFO kumiko_jobs\.runs: succeeded tests\.record run={ok.run_id} tenant={tenants[0].pk} "
        r"attempt=1/1 \d+\.\dms",
        output,
    )
    assert re.search(
        rf"{STAMP} ERROR kumiko_jobs\.runs: failed tests\.unrecoverable run={bad.run_id} "
        rf"tenant={tenants[1].pk} attempt=1/4 \d+\.\dms error=UnrecoverableError: this cannot work",
        output,
    )
    assert "s3cr3t-payload" not in output
    # With Django's default CONN_MAX_AGE (0) the worker still keeps its connection (and its
    # writer thread's) for every job.
    [opened] = re.findall(r"database connections opened: (\d+)", output)
    assert int(opened) <= 2


def test_verbosity_0_prints_only_problems(start_worker: Any, tenants: list[Any]) -> None:
    dispatch("tests.record", {}, tenant=tenants[0])
    dispatch("tests.unrecoverable", {}, tenant=tenants[0])
    worker = start_worker("worker", "--burst", "-v", "0", wait=False)
    assert worker.wait(timeout=60) == 0
    output = worker.output()
    assert "failed tests.unrecoverable" in output
    assert "succeeded tests.record" not in output and "consuming lane" not in output
