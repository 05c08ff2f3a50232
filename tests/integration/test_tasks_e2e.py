"""End to end: Django ``@task`` functions on real ``runjobs`` workers (KumikoTaskBackend).

The test process enqueues (inside a tenant when the test needs one) and reads results back
from the run records; the worker subprocesses run the tasks and write them. Waits are
event-based (a run's status, traces), with generous deadlines.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from typing import Any

import pytest
from django.tasks import TaskResultStatus, default_task_backend

from kumiko_jobs.exceptions import JobTimeout
from kumiko_jobs.tenancy import tenant_context
from tests.integration.support import wait_until
from tests.testapp import lazy_tasks, tasks

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def spans(entries: Iterable[dict[str, Any]], kind: str) -> dict[str, tuple[float, float]]:
    starts = {e["label"]: e["t"] for e in entries if e["kind"] == f"{kind}_start"}
    ends = {e["label"]: e["t"] for e in entries if e["kind"] == f"{kind}_end"}
    return {label: (starts[label], ends[label]) for label in starts.keys() & ends.keys()}


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    events = sorted(itertools.chain.from_iterable(((s, 1), (e, -1)) for s, e in intervals))
    return max(itertools.accumulate(delta for _, delta in events), default=0)


def test_tenant_result_and_log_lines_across_processes(
    start_worker: Any, wait_for_run: Any, tenants: list[Any]
) -> None:
    # DEBUG on: Django prints its task log lines only through its console handler, which
    # wants DEBUG (require_debug_true); the workers of these tests run with DEBUG off.
    worker = start_worker("worker", env={"DJANGO_DEBUG": "1"})
    tenant = str(tenants[0].pk)
    with tenant_context(tenant):
        result = tasks.traced.enqueue("e2e")
    run = wait_for_run(result.id)
    assert (run.status, run.tenant_id, run.worker) == ("succeeded", tenant, worker.args[3])

    found = default_task_backend.get_result(result.id)  # read here, written by the worker
    assert found.status == TaskResultStatus.SUCCESSFUL
    assert found.return_value == {"label": "e2e", "tenant": tenant}
    assert found.worker_ids == [worker.args[3]]
    assert found.enqueued_at == result.enqueued_at
    assert found.enqueued_at <= found.started_at <= found.finished_at  # type: ignore[operator]
    # Django's two worker-side lines.
    output = wait_until(lambda: worker.output() if "state=SUCCESSFUL" in worker.output() else "", 10, "log")
    path = "tests.testapp.tasks.traced"
    assert f"Task id={result.id} path={path} state=RUNNING" in output
    assert f"Task id={result.id} path={path} state=SUCCESSFUL" in output


def test_retries_are_visible_from_another_process(start_worker: Any, wait_for_run: Any) -> None:
    worker = start_worker("worker")
    result = tasks.flaky.enqueue(3)
    wait_for_run(result.id, timeout=20)
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (TaskResultStatus.SUCCESSFUL, 3, 3)
    assert result.worker_ids == [worker.args[3]] * 3
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]


def test_a_tasks_cap_holds_across_workers_and_never_delays_another_tenant(
    start_worker: Any, wait_for_traces: Any, traces: Any, tenants: list[Any]
) -> None:
    for _ in range(2):
        start_worker("worker")
    acme, globex = str(tenants[0].pk), str(tenants[1].pk)
    with tenant_context(acme):
        for n in range(3):
            tasks.capped.enqueue(f"acme-{n}", 0.4)
    with tenant_context(globex):
        tasks.capped.enqueue("globex-0", 0.4)
    wait_for_traces("capped_end", count=4, timeout=30)
    by_label = spans(traces(), "capped")
    acme_spans = [span for label, span in by_label.items() if label.startswith("acme")]
    assert max_overlap(acme_spans) == 1  # the cap of one per tenant, across both workers
    # Globex's run overlapped acme's (its own cap, a free worker), it did not wait behind them.
    assert max_overlap([by_label["globex-0"], *acme_spans]) == 2
    assert by_label["globex-0"][0] < max(end for _, end in acme_spans) - 0.4


def test_priority_orders_a_tenants_runs_but_fairness_comes_first(
    start_worker: Any, wait_for_traces: Any, traces: Any, tenants: list[Any]
) -> None:
    acme, globex = str(tenants[0].pk), str(tenants[1].pk)
    with tenant_context(acme):
        for n in range(5):
            tasks.traced.using(priority=n * 10).enqueue(f"acme-p{n * 10}")
        tasks.traced.using(priority=100).enqueue("acme-p100")
    with tenant_context(globex):
        tasks.traced.using(priority=-100).enqueue("globex-low")
    start_worker("worker")  # one worker, started with the backlog in place
    wait_for_traces("traced_end", count=7, timeout=20)
    order = [e["label"] for e in traces("traced_start")]
    assert [label for label in order if label.startswith("acme")] == [
        "acme-p100", "acme-p40", "acme-p30", "acme-p20", "acme-p10", "acme-p0"
    ]  # fmt: skip
    assert order.index("globex-low") <= 1  # served in its tenant's turn, not after acme's


def test_async_task_timeout_in_a_worker(start_worker: Any, wait_for_run: Any) -> None:
    start_worker("worker")
    started = time.monotonic()
    result = tasks.slow_async.enqueue(5)
    wait_for_run(result.id)
    assert time.monotonic() - started < 4
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is JobTimeout


def test_a_worker_imports_a_task_it_meets_by_name(start_worker: Any, wait_for_run: Any) -> None:
    start_worker("api")
    result = lazy_tasks.lazy.enqueue(41)
    wait_for_run(result.id)
    result.refresh()
    assert result.return_value == 42


def test_async_tasks_and_handlers_on_job_threads(
    start_worker: Any, wait_for_run: Any, traces: Any, tenants: list[Any]
) -> None:
    from kumiko_jobs import dispatch

    start_worker("worker", "--threads", "2")
    tenant = str(tenants[0].pk)
    with tenant_context(tenant):
        sync_result = tasks.traced.enqueue("on-a-thread")
        async_results = [tasks.noop_task_async.enqueue(n) for n in range(4)]
    handler = dispatch("tests.async_record", {"chain": True}, tenant=tenants[0])
    for result in (sync_result, *async_results):
        assert wait_for_run(result.id).status == "succeeded"
    assert wait_for_run(handler.run_id).status == "succeeded"
    [entry] = traces("async_record")
    assert entry["active_tenant"] == tenant
    assert wait_for_run(entry["chained"]).tenant_id == tenant
