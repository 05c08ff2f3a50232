"""Priority-ordered flows (flows.py ``o`` kind, lua/flow_store.lua) through Django tasks:
priority orders one tenant's runs, never one tenant ahead of another; caps still hold."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from kumiko_jobs import flows
from kumiko_jobs.connection import get_keys
from kumiko_jobs.lane import Claim, Finished, finish_and_claim
from kumiko_jobs.outcomes import Outcome, Release
from kumiko_jobs.tenancy import tenant_context
from kumiko_jobs.testing import drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def job_id(result_id: str) -> str:
    return f"{get_keys().id_tag}-{uuid.UUID(result_id).hex}"


def labels(traces: Any) -> list[str]:
    return [entry["label"] for entry in traces("traced_start")]


def test_higher_priority_first_equal_priorities_in_queue_order(traces: Any, redis_client: Any) -> None:
    for label, priority in [("a0", 0), ("b5", 5), ("c0", 0), ("d-3", -3), ("e5", 5), ("f100", 100)]:
        tasks.traced.using(priority=priority).enqueue(label)
    flow_key = get_keys().flow("worker", "ot|")
    assert redis_client.type(flow_key) == b"zset"
    assert redis_client.zcard(flow_key) == 6
    assert drain() == {"succeeded": 6}
    assert labels(traces) == ["f100", "b5", "e5", "a0", "c0", "d-3"]


def test_priority_never_overtakes_another_tenant(traces: Any, tenants: list[Any]) -> None:
    acme, globex = str(tenants[0].pk), str(tenants[1].pk)
    with tenant_context(acme):
        for n in range(4):
            tasks.traced.using(priority=100).enqueue(f"acme-{n}")
    with tenant_context(globex):
        tasks.traced.using(priority=-100).enqueue("globex-low")
    assert drain() == {"succeeded": 5}
    # The ring serves tenants in turn (a flow that just got work first): globex's lowest
    # priority run is among the first two, not behind acme's highest.
    order = labels(traces)
    assert order.index("globex-low") <= 1
    assert [label for label in order if label.startswith("acme")] == [f"acme-{n}" for n in range(4)]


def test_ordinary_flows_stay_lists(redis_client: Any) -> None:
    from kumiko_jobs import dispatch

    dispatch("tests.record", {"n": 1})
    assert redis_client.type(get_keys().flow("worker", "t|")) == b"list"


def test_a_capped_task_waits_in_an_ordered_capped_flow(tenants: list[Any], redis_client: Any) -> None:
    tenant = str(tenants[0].pk)
    with tenant_context(tenant):
        first = tasks.capped.using(priority=1).enqueue("first", 0)
        second = tasks.capped.using(priority=9).enqueue("second", 0)
    flow = f"oc1|tests.testapp.tasks.capped|{tenant}"
    assert flows.cap_of(flow) == (1, f"|tests.testapp.tasks.capped|{tenant}")
    assert redis_client.zcard(get_keys().flow("worker", flow)) == 2
    client, keys = redis_client, get_keys()
    claim = Claim("w", "e1", 2e9)
    job = finish_and_claim(client, keys, "worker", claim=claim)
    assert job is not None and job.job_id == job_id(second.id)  # priority 9 first
    # At its cap of one: the other run waits, however high its priority.
    assert finish_and_claim(client, keys, "worker", claim=Claim("w", "e2", 2e9)) is None
    outcome = Outcome("ok", "succeeded", Release(flow=flow), ttl=60)
    nxt = finish_and_claim(client, keys, "worker", Finished(job.job_id, f"{job.job_id}:e1", outcome), claim)
    assert nxt is not None and nxt.job_id == job_id(first.id)


def test_django_rq_queue_counts_ordered_flows(redis_client: Any) -> None:
    from kumiko_jobs.dashboard.queue import LaneQueue

    results = [tasks.traced.using(priority=n).enqueue(f"n{n}") for n in range(3)]
    tasks.noop_task.enqueue()  # priority 0, queued last: served last
    queue = LaneQueue(get_keys().queue_name("worker"), connection=redis_client)
    assert queue.count == 4
    # Listed in the order they will be served; the oldest head is read from the sorted set too.
    assert queue.get_job_ids()[:3] == [job_id(r.id) for r in reversed(results)]
    assert queue.get_job_ids(offset=1, length=2) == [job_id(r.id) for r in reversed(results[:2])]
    assert queue.oldest_enqueued_at() is not None


def test_a_retried_run_goes_behind_its_equals(traces: Any) -> None:
    failing = tasks.flaky.enqueue(2)  # fails once, then succeeds
    tasks.traced.enqueue("queued-after")
    assert drain() == {"retried": 1, "succeeded": 2}
    order = [e["kind"] for e in traces() if e["kind"] in ("task_flaky", "traced_start")]
    assert order == ["task_flaky", "traced_start", "task_flaky"]
    failing.refresh()
    assert failing.return_value == 2


def test_jobs_stats_counts_ordered_flows(redis_client: Any) -> None:
    from kumiko_jobs import dispatch
    from kumiko_jobs.cli.stats import lane_counts

    tasks.traced.enqueue("a")
    tasks.traced.using(priority=3).enqueue("b")
    dispatch("tests.record", {"n": 1})
    assert lane_counts(redis_client, get_keys(), "worker")["queued"] == 3
