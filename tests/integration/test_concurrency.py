"""End to end: ``runjobs --threads N`` and ``--processes P``: real processes, real threads."""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from typing import Any

import pytest

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from tests.integration.support import wait_until

pytestmark = pytest.mark.slow
FAST = {
    "KUMIKO_TEST_ABANDON_AFTER": "4",
    "KUMIKO_TEST_HEARTBEAT_INTERVAL": "1",
    "KUMIKO_TEST_STUCK_AFTER": "1",
}


def overlap(spans: list[tuple[float, float]]) -> int:
    """Most spans open at one moment."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def spans_of(traces: Any, kind: str) -> list[tuple[float, float]]:
    starts = {e["run_id"]: e["t"] for e in traces(f"{kind}_start")}
    return [(starts[e["run_id"]], e["t"]) for e in traces(f"{kind}_end") if e["run_id"] in starts]


def test_eight_threads_run_eight_jobs_at_once_on_one_connection_each(
    start_worker: Any, traces: Any, tenants: list[Any]
) -> None:
    # 1 s each: the eight first ones overlap even if the threads' first claims spread out.
    runs = [dispatch("tests.sleeper", {"seconds": 1.0}, tenant=tenants[i % 3]) for i in range(16)]
    started = time.monotonic()
    worker = start_worker("worker", "--threads", "8", "--burst", wait=False)
    assert worker.wait(timeout=60) == 0
    elapsed = time.monotonic() - started
    spans = [(s["t"], e["t"]) for s, e in zip(traces("sleeper_start"), traces("sleeper_end"), strict=False)]
    assert {JobRun.objects.get(pk=r.run_id).status for r in runs} == {RunStatus.SUCCEEDED}
    assert overlap(spans) == 8
    assert elapsed < 12  # 16 x 1 s, 8 at a time (plus start-up); one at a time: 16 s
    [opened] = [line for line in worker.output().splitlines() if "database connections opened" in line]
    assert int(opened.rsplit(": ", 1)[1]) <= 8 + 3  # a connection per thread (+ marker, writer, main)


def test_thread_timeout_stops_python_code_and_a_stuck_handler_recycles_the_process(
    start_worker: Any, traces: Any, wait_for_run: Any, wait_for_traces: Any
) -> None:
    looping = dispatch("tests.busy_loop", {"seconds": 30})
    worker = start_worker("worker", "--threads", "2", env=FAST)
    run = wait_for_run(looping.run_id, ("failed",), timeout=20)
    assert "JobTimeout: Job 'tests.busy_loop' exceeded its timeout of 0.5s" in run.error
    assert run.attempt == 2 and traces("busy_loop_end") == []
    # A handler blocked in C code ignores the exception: the process gives its lease up and exits
    # for a restart; the run is retried elsewhere.
    stuck = dispatch("tests.stuck", {"seconds": 60})
    wait_for_traces("stuck_start")
    assert worker.wait(timeout=30) == 75
    assert "job tests.stuck is stuck past its timeout" in worker.output()
    start_worker("worker", "--threads", "2", env=FAST)
    run = wait_for_run(stuck.run_id, ("succeeded",), timeout=30)
    assert run.attempt == 2


def test_sigterm_lets_every_busy_thread_finish(start_worker: Any, traces: Any, wait_for_traces: Any) -> None:
    busy = [dispatch("tests.sleeper", {"seconds": 1.5}) for _ in range(4)]
    waiting = dispatch("tests.record", {})
    worker = start_worker("worker", "--threads", "4")
    wait_for_traces("sleeper_start", 4)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    assert len(traces("sleeper_end")) == 4
    assert {JobRun.objects.get(pk=r.run_id).status for r in busy} == {RunStatus.SUCCEEDED}
    assert JobRun.objects.get(pk=waiting.run_id).status == RunStatus.QUEUED
    assert "SIGTERM received: finishing the running jobs, then stopping" in worker.output()


def test_supervisor_replaces_a_killed_worker_process_and_its_run_is_retried(
    start_worker: Any, redis_client: Any, kumiko_prefix: str, wait_for_run: Any, wait_for_traces: Any
) -> None:
    held = dispatch("tests.hang_first", {"seconds": 60})
    supervisor = start_worker("worker", "--processes", "2", "--threads", "2", env=FAST, wait=False)
    names = [f"{kumiko_prefix}-worker-1-p{slot}" for slot in (1, 2)]
    wait_until(
        lambda: all(redis_client.sismember(get_keys().claimers("worker"), n) for n in names), 30, "children"
    )
    [start] = wait_for_traces("hang_first_start")
    os.kill(start["pid"], signal.SIGKILL)  # the child holding the run dies
    run = wait_for_run(held.run_id, ("succeeded",), timeout=40)
    assert run.attempt == 2
    assert "exited -9; restarting it" in supervisor.output()
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0


def test_a_supervisors_options_given_with_an_equals_sign_name_its_children(
    start_worker: Any, redis_client: Any, kumiko_prefix: str
) -> None:
    """start_worker names the supervisor with ``--name X``; the ``--name=`` after it is the
    name argparse keeps, so its children must be named after it too (before, they were named
    after the host and the supervisor's pid)."""
    supervisor = start_worker("worker", f"--name={kumiko_prefix}-box", "--processes=2", env=FAST, wait=False)
    names = [f"{kumiko_prefix}-box-p{slot}" for slot in (1, 2)]
    wait_until(
        lambda: all(redis_client.sismember(get_keys().claimers("worker"), n) for n in names), 30, "children"
    )
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0


def test_supervisor_stops_when_workers_keep_dying_at_start_up(start_worker: Any) -> None:
    supervisor = start_worker(
        "worker", "--processes", "2", env={"KUMIKO_CRASH_AT": "worker:start"}, wait=False
    )
    assert supervisor.wait(timeout=60) == 1
    assert "died 5 times within 10s of its start" in supervisor.output()


def test_supervisor_restarts_a_worker_process_that_reached_max_jobs(
    start_worker: Any, wait_for_traces: Any
) -> None:
    """Two children of at most 3 jobs each cannot run 8 runs: the supervisor replaces a child
    that exits cleanly at --max-jobs (with --processes 1 there is no supervisor, and the worker
    itself exits)."""
    runs = [dispatch("tests.record", {"n": n}) for n in range(8)]
    supervisor = start_worker("worker", "--processes", "2", "--max-jobs", "3", env=FAST, wait=False)
    entries = wait_for_traces("record", count=8, timeout=60)
    per_process = Counter(e["pid"] for e in entries)
    assert max(per_process.values()) <= 3 and len(per_process) >= 3, per_process
    assert supervisor.output().count("ran its --max-jobs; restarting it") >= 1, supervisor.output()
    # A trace is written inside the job; its success is written after it, in a batch. Only a
    # stopped worker has written every batch.
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0
    assert {JobRun.objects.get(pk=r.run_id).status for r in runs} == {RunStatus.SUCCEEDED}


def test_a_burst_supervisor_works_the_lane_off_past_its_childrens_max_jobs(
    start_worker: Any, wait_for_traces: Any
) -> None:
    """Under --burst a child that reached --max-jobs is replaced like any recycled child: only a
    child that found the lane empty ends the burst."""
    runs = [dispatch("tests.record", {"n": n}) for n in range(8)]
    supervisor = start_worker(
        "worker", "--processes", "2", "--max-jobs", "3", "--burst", env=FAST, wait=False
    )
    assert supervisor.wait(timeout=60) == 0
    statuses = [JobRun.objects.get(pk=r.run_id).status for r in runs]
    assert statuses == [RunStatus.SUCCEEDED] * 8, supervisor.output()
    per_process = Counter(e["pid"] for e in wait_for_traces("record", count=8))
    assert max(per_process.values()) <= 3 and len(per_process) >= 3, per_process


def test_supervisor_recycles_a_worker_process_past_max_memory(
    start_worker: Any, wait_for_traces: Any, wait_for_run: Any
) -> None:
    """A child that grows past --max-memory is stopped (SIGTERM: it ends cleanly) and replaced;
    the next run is worked by the new one. The limit sits between a fresh child's resident
    memory and that plus the ballast."""
    supervisor = start_worker("worker", "--processes", "1", "--max-memory", "250", env=FAST, wait=False)
    grown = dispatch("tests.ballast", {"mb": 400})
    [entry] = wait_for_traces("ballast", timeout=30)
    assert wait_for_run(grown.run_id).status == RunStatus.SUCCEEDED
    wait_until(lambda: "exited 0; restarting it" in supervisor.output(), 30, "the recycled child's restart")
    recycled = re.findall(r"worker process 1 uses (\d+) MB; recycling it", supervisor.output())
    # The child recycled is the one that carried the ballast, not a fresh one over the limit.
    assert recycled and int(recycled[0]) >= 400, supervisor.output()
    after = dispatch("tests.record", {"n": "after"})
    [record] = wait_for_traces("record", timeout=30)
    assert record["pid"] != entry["pid"]
    assert wait_for_run(after.run_id).status == RunStatus.SUCCEEDED
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0


def test_a_burst_supervisor_replaces_a_worker_process_it_recycled_for_memory(
    start_worker: Any, wait_for_traces: Any
) -> None:
    """Under --burst a child that exits 0 found its lane empty, except one the supervisor
    stopped itself: that one is replaced, or the runs still queued would be left behind."""
    grown = dispatch("tests.ballast", {"mb": 400})
    later = [dispatch("tests.sleeper", {"seconds": 2}) for _ in range(4)]
    supervisor = start_worker(
        "worker", "--processes", "1", "--max-memory", "250", "--burst", env=FAST, wait=False
    )
    assert supervisor.wait(timeout=60) == 0
    assert "recycling it" in supervisor.output(), supervisor.output()
    statuses = [JobRun.objects.get(pk=r.run_id).status for r in [grown, *later]]
    assert statuses == [RunStatus.SUCCEEDED] * 5, supervisor.output()
    assert len({e["pid"] for e in wait_for_traces("sleeper_end", 4)}) == 2  # before and after


def _children(kumiko_prefix: str) -> list[str]:
    return [f"{kumiko_prefix}-worker-1-p{slot}" for slot in (1, 2)]


def _pids(redis_client: Any, names: list[str]) -> list[int | None]:
    """Each registered child's pid (RQ's worker hash), None while one is not registered."""
    claimers = get_keys().claimers("worker")
    pids: list[int | None] = []
    for name in names:
        pid = redis_client.hget(f"rq:worker:{name}", "pid")
        pids.append(int(pid) if pid and redis_client.sismember(claimers, name) else None)
    return pids


def _two_children_one_busy(
    start_worker: Any, redis_client: Any, kumiko_prefix: str, wait_for_traces: Any
) -> tuple[Any, list[str], list[int | None], Any]:
    """A supervisor of two children, one of them running a 2 s run: (supervisor, the children's
    names, their pids, the run's dispatch result)."""
    supervisor = start_worker("worker", "--processes", "2", env=FAST, wait=False)
    names = _children(kumiko_prefix)
    wait_until(lambda: None not in _pids(redis_client, names), 30, "both children")
    pids = _pids(redis_client, names)
    busy = dispatch("tests.sleeper", {"seconds": 2})
    wait_for_traces("sleeper_start")
    return supervisor, names, pids, busy


def _gone(pid: int) -> bool:
    """The process has exited (a zombie counts: its parent died, and nobody reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_worker_processes_finish_their_jobs_and_stop_when_their_supervisor_is_killed(
    start_worker: Any, redis_client: Any, kumiko_prefix: str, wait_for_run: Any, wait_for_traces: Any
) -> None:
    """A supervisor killed outright (the OOM killer; a process manager's SIGKILL, which reaches
    its process group only, and each child has its own) must not leave its children working on
    unsupervised beside the ones its replacement starts."""
    supervisor, names, pids, busy = _two_children_one_busy(
        start_worker, redis_client, kumiko_prefix, wait_for_traces
    )
    supervisor.signal(signal.SIGKILL)
    assert supervisor.wait(timeout=10) == -signal.SIGKILL
    run = wait_for_run(busy.run_id, ("succeeded",), timeout=20)
    assert run.attempt == 1  # finished by its child, not retried after the lease ran out
    wait_until(lambda: all(_gone(pid) for pid in pids if pid), 15, "the children to stop")
    assert _pids(redis_client, names) == [None, None]  # each said goodbye to its lane
    assert supervisor.output().count(f"its supervisor (pid {supervisor.pid}) is gone") == 2


def test_sighup_restarts_the_worker_processes_once_their_running_jobs_finish(
    start_worker: Any, redis_client: Any, kumiko_prefix: str, wait_for_run: Any, wait_for_traces: Any
) -> None:
    """A deploy's reload (systemd's ExecReload): new worker processes, so new code, without a
    run cut off or the supervisor restarted."""
    supervisor, names, before, busy = _two_children_one_busy(
        start_worker, redis_client, kumiko_prefix, wait_for_traces
    )
    supervisor.signal(signal.SIGHUP)
    assert wait_for_run(busy.run_id, ("succeeded",), timeout=20).attempt == 1
    wait_until(
        lambda: all(pid is not None and pid not in before for pid in _pids(redis_client, names)),
        30,
        "two new children",
    )
    assert all(_gone(pid) for pid in before if pid)
    after = dispatch("tests.record", {"n": "after"})
    [record] = wait_for_traces("record", timeout=30)
    assert record["pid"] in _pids(redis_client, names)
    assert wait_for_run(after.run_id).status == RunStatus.SUCCEEDED
    assert supervisor.proc.poll() is None
    assert "SIGHUP received: restarting the worker processes" in supervisor.output()
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0


def test_caps_and_fairness_hold_under_two_processes_of_eight_threads(
    start_worker: Any, traces: Any, tenants: list[Any]
) -> None:
    a, b = (str(t.pk) for t in tenants[:2])
    runs = [dispatch("tests.capped", {"seconds": 0.2}, tenant=tenant) for tenant in [a] * 20 + [b] * 20]
    supervisor = start_worker("worker", "--processes", "2", "--threads", "8", env=FAST, wait=False)
    wait_until(lambda: len(traces("capped_end")) == 40, 60, "40 capped runs")
    by_tenant = {tenant: [(s["t"], e["t"]) for s, e in _pairs(traces, "capped", tenant)] for tenant in (a, b)}
    # MaxPerTenant(2, "defer"): never more than 2 of a tenant at once, and each reached 2.
    assert [overlap(by_tenant[t]) for t in (a, b)] == [2, 2]
    # Fair: B's runs were not starved behind A's (both tenants finish at about the same time).
    assert abs(max(e for _, e in by_tenant[a]) - max(e for _, e in by_tenant[b])) < 1.5
    supervisor.signal(signal.SIGTERM)  # it writes its last batch of successes, then exits
    assert supervisor.wait(timeout=30) == 0
    assert {JobRun.objects.get(pk=r.run_id).status for r in runs} == {RunStatus.SUCCEEDED}


def _pairs(traces: Any, kind: str, tenant: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    ends = {e["run_id"]: e for e in traces(f"{kind}_end") if e["tenant"] == tenant}
    return [
        (s, ends[s["run_id"]])
        for s in traces(f"{kind}_start")
        if s["tenant"] == tenant and s["run_id"] in ends
    ]
