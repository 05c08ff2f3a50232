"""End to end: lane schedules with real runjobs processes (leader election, failover, orphans,
per-tenant local time) and ``jobs list --json``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime
from typing import Any

import pytest

from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun
from kumiko_jobs.scheduling.lease import LEASE_SECONDS
from kumiko_jobs.scheduling.registration import registered_schedules
from kumiko_jobs.scheduling.specs import tick_job_id
from tests.integration.support import REPO_ROOT, holds_for, wait_until
from tests.testapp.tenants import set_zones

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
EVERY_SECOND = {"KUMIKO_TEST_SCHEDULES": "every_second"}
JOB = "tests.every_second"


def tick_seconds() -> list[int]:
    """The ticks recorded (one run row each), as UTC epoch seconds, from the rows' job ids."""
    ids = set(JobRun.objects.filter(job_name=JOB, trigger_name="cron").values_list("job_id", flat=True))
    prefix = tick_job_id(get_keys(), JOB, 0)[:-1]
    assert all(job_id.startswith(prefix) for job_id in ids)
    return sorted(int(job_id.removeprefix(prefix)) for job_id in ids)


def assert_each_tick_once(traces: Any) -> list[int]:
    """Every second from the first tick to the last has one run row, and no tick ran under two
    job ids or twice under one (a retry after a killed worker would show as attempt 2)."""
    seconds = tick_seconds()
    assert seconds == list(range(seconds[0], seconds[-1] + 1)), "a tick was lost"
    runs: dict[str, set[str]] = defaultdict(set)
    for entry in traces("every_second"):
        runs[entry["scheduled_at"]].add(entry["job_id"])
        assert entry["attempt"] == 1, entry
    assert all(len(ids) == 1 for ids in runs.values()), "a tick was enqueued twice"
    assert len(traces("every_second")) == len(runs), "a tick ran twice"
    return seconds


def test_three_processes_run_each_tick_once(start_worker: Any, traces: Any) -> None:
    workers = [start_worker("worker", env=EVERY_SECOND) for _ in range(3)]

    wait_until(lambda: len(tick_seconds()) >= 12, 30, "12 ticks")
    for worker in workers:
        worker.stop()

    seconds = assert_each_tick_once(traces)
    assert len(seconds) >= 12
    assert len(traces("every_second")) >= len(seconds) - 3  # the last ones may still be queued
    runs = JobRun.objects.filter(job_name=JOB)
    assert {(r.trigger_name, r.triggered_by) for r in runs} == {("cron", None)}


def test_leader_killed_is_replaced_without_losing_or_doubling_ticks(
    start_worker: Any, traces: Any, redis_client: Any
) -> None:
    workers = {
        w.args[w.args.index("--name") + 1]: w
        for w in (start_worker("worker", env=EVERY_SECOND) for _ in range(2))
    }
    lease = get_keys().scheduler_lease("worker")
    holder = wait_until(lambda: redis_client.get(lease), 10, "a leader").decode().split("|", 1)[1]
    wait_until(lambda: len(tick_seconds()) >= 3, 15, "3 ticks")

    workers[holder].kill_group()
    killed_at = time.monotonic()
    [survivor] = [name for name in workers if name != holder]
    wait_until(lambda: (redis_client.get(lease) or b"").decode().endswith("|" + survivor), 30, "failover")
    failover = time.monotonic() - killed_at
    count = len(tick_seconds())
    wait_until(lambda: len(tick_seconds()) >= count + 3, 15, "ticks after the failover")
    wait_until(lambda: len(traces("every_second")) >= len(tick_seconds()) - 1, 15, "the late ticks to run")
    workers[survivor].stop()

    assert failover < LEASE_SECONDS + 5 < 30
    assert_each_tick_once(traces)


def test_orphaned_schedule_is_removed_after_the_grace_and_not_before(
    start_worker: Any, redis_client: Any
) -> None:
    grace = 4.0
    timing = {"KUMIKO_TEST_ORPHAN_GRACE": str(grace)}
    old_id = "tests.old_schedule|0 0 1 1 *|UTC"
    old = start_worker("worker", env={**timing, "KUMIKO_TEST_SCHEDULES": "old_schedule"})
    start_worker("worker", env=timing)  # the new deploy no longer declares it

    def registered() -> bool:
        return old_id in registered_schedules(redis_client, get_keys(), "worker")

    wait_until(registered, 10, "the old schedule to be registered")
    # Rolling deploy: while an old process runs, its schedule stays, however long that is.
    assert holds_for(registered, seconds=grace + 2)

    old.stop()
    # Measured from the old process's last stamp (wall clock, as the scheduler's): it may have
    # stamped up to a second before its exit, or just before it.
    last_stamp = registered_schedules(redis_client, get_keys(), "worker")[old_id]
    assert holds_for(registered, seconds=last_stamp + grace - 0.5 - time.time())
    wait_until(lambda: not registered(), grace + 5, "the orphan to be removed")
    assert time.time() >= last_stamp + grace
    assert not redis_client.exists(get_keys().schedule_cursor("worker", old_id))


def test_tenant_local_schedule_reaches_every_tenant_in_its_zone(
    start_worker: Any, tenants: Any, traces: Any
) -> None:
    zones = ("Europe/Berlin", "America/New_York", "Asia/Tokyo")
    set_zones({str(t.pk): zone for t, zone in zip(tenants, zones, strict=True)})
    start_worker("worker", env={"KUMIKO_TEST_SCHEDULES": "tenant_every_second"})

    def every_tenant_ran_twice() -> bool:
        runs = [t["tenant"] for t in traces("tenant_every_second")]
        return all(runs.count(str(t.pk)) >= 2 for t in tenants)

    wait_until(every_tenant_ran_twice, 30, "runs for every tenant")

    seen = [(t["tenant"], t["scheduled_at"]) for t in traces("tenant_every_second")]
    assert len(seen) == len(set(seen))  # one run per tenant and tick
    wrappers = JobRun.objects.filter(job_name="_per_tenant:tests.tenant_every_second")
    assert {w.fanout_count for w in wrappers if w.status == "succeeded"} == {1}


def test_jobs_list_json_gives_next_fire_times(worker_env: dict[str, str]) -> None:
    before = time.time()
    done = subprocess.run(
        [sys.executable, "manage.py", "jobs", "list", "--json"], cwd=REPO_ROOT,
        env={**worker_env, **EVERY_SECOND}, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip

    listed = {job["name"]: job for job in json.loads(done.stdout)}
    every = listed[JOB]
    assert every["triggers"] == ["cron:* * * * * * UTC"]
    assert every["lane"] == "worker" and every["last_success_at"] is None
    next_fire = datetime.fromisoformat(every["next_fire_at"])
    assert next_fire.utcoffset() is not None and next_fire.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    assert before < next_fire.timestamp() <= time.time() + 1
    assert listed["tests.record"]["next_fire_at"] is None


def test_supervised_processes_with_threads_run_each_tick_once(
    start_worker: Any, traces: Any, redis_client: Any, kumiko_prefix: str
) -> None:
    supervisor = start_worker("worker", "--processes", "2", "--threads", "2", env=EVERY_SECOND, wait=False)
    names = [f"{kumiko_prefix}-worker-1-p{slot}" for slot in (1, 2)]
    wait_until(
        lambda: all(redis_client.sismember(get_keys().claimers("worker"), n) for n in names), 30, "children"
    )

    wait_until(lambda: len(tick_seconds()) >= 8, 30, "8 ticks")
    supervisor.stop()

    assert_each_tick_once(traces)
