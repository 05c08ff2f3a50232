from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import transaction

from kumiko_jobs import InvalidPayload, InvalidTenant, QueueUnavailable, UnknownJob, dispatch, emit
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def test_dispatch_records_queued_run_and_drain_runs_it(
    traces: Any, redis_client: Any, tenants: list[Any]
) -> None:
    tenant = tenants[0]
    result = dispatch("tests.record", {"n": 1}, tenant=tenant)
    assert result.status == "queued"
    assert result.run_id and uuid.UUID(result.run_id).version == 7  # time-ordered: run_ids.py
    run = JobRun.objects.get(pk=result.run_id)
    assert (run.status, run.job_id, run.tenant_id, run.attempt) == (
        "queued",
        result.job_id,
        str(tenant.pk),
        1,
    )
    flow = get_keys().flow("worker", f"t|{tenant.pk}")
    assert redis_client.lrange(flow, 0, -1) == [result.job_id.encode()]

    assert drain() == {"succeeded": 1}
    [entry] = traces("record")
    assert entry["payload"] == {"n": 1}
    assert (entry["tenant"], entry["attempt"], entry["final"], entry["lane"]) == (
        str(tenant.pk),
        1,
        True,
        "worker",
    )
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    assert run.started_at and run.finished_at and run.finished_at >= run.started_at
    assert [line["msg"] for line in run.logs] == ["recording 1"]


def test_unknown_job_lists_close_matches() -> None:
    with pytest.raises(UnknownJob, match=r"Did you mean: tests\.record"):
        dispatch("tests.recrod", {})
    assert not JobRun.objects.exists()


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        ([1, 2], r"\$"),
        ({"when": object()}, r"\$\.when"),
        ({"a": {"b": [1, {2: "x"}]}}, r"\$\.a\.b\[1\]\.2"),
        ({"x": float("nan")}, r"\$\.x"),
    ],
)
def test_invalid_payload_names_key_path_and_enqueues_nothing(
    payload: Any, path: str, redis_client: Any
) -> None:
    with pytest.raises(InvalidPayload, match=path):
        dispatch("tests.record", payload)
    assert not JobRun.objects.exists()
    assert not redis_client.exists(get_keys().ring("worker"))


def test_unknown_tenant_is_rejected(redis_client: Any) -> None:
    with pytest.raises(InvalidTenant, match="does not exist"):
        dispatch("tests.record", {}, tenant=987654)
    with pytest.raises(InvalidTenant, match="must be a tenant model instance or its id"):
        dispatch("tests.record", {}, tenant=["acme"])
    assert not JobRun.objects.exists()
    assert not redis_client.exists(get_keys().ring("worker"))


def test_inside_atomic_ids_return_at_once_and_push_on_commit(redis_client: Any) -> None:
    queue = get_keys().flow("worker", "t|")
    with transaction.atomic():
        result = dispatch("tests.record", {"n": 2})
        assert result.job_id and result.run_id
        assert redis_client.llen(queue) == 0
    assert redis_client.lrange(queue, 0, -1) == [result.job_id.encode()]
    assert JobRun.objects.filter(pk=result.run_id, status="queued").exists()


def test_rollback_means_no_job_and_no_record(redis_client: Any) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        dispatch("tests.record", {"n": 3})
        raise RuntimeError("rollback")
    assert not redis_client.exists(get_keys().ring("worker"))
    assert not JobRun.objects.exists()
    assert drain() == {}


def test_redis_down_raises_queue_unavailable_within_timeout(settings: Any) -> None:
    import time

    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "REDIS_TIMEOUT": 0.5,
    }
    started = time.monotonic()
    with pytest.raises(QueueUnavailable, match="nothing was enqueued or recorded"):
        dispatch("tests.record", {})
    assert time.monotonic() - started < 2.0
    assert not JobRun.objects.exists()


def test_emit_matches_events_and_where_filters(traces: Any) -> None:
    assert [r.job_name for r in emit("invoice.created", {"id": 1})] == ["tests.on_invoice"]
    assert emit("invoice.paid", {"kind": "charge"}) == []
    [paid] = emit("invoice.paid", {"kind": "refund"})
    assert emit("nothing.listens", {}) == []
    drain()
    assert sorted(e["trigger"] for e in traces("on_invoice")) == ["invoice.created", "invoice.paid"]
    assert JobRun.objects.get(pk=paid.run_id).trigger_name == "invoice.paid"


def test_user_and_tenant_travel_as_metadata_not_payload(
    traces: Any, django_user_model: Any, tenants: list[Any]
) -> None:
    user = django_user_model.objects.create(username="ann")
    dispatch("tests.record", {"tenant_id": "forged"}, tenant=str(tenants[1].pk), user=user)
    drain()
    [entry] = traces("record")
    assert (entry["tenant"], entry["user"]) == (str(tenants[1].pk), str(user.pk))
    assert entry["payload"] == {"tenant_id": "forged"}


def test_chained_dispatch_keeps_tenant_and_correlation(traces: Any, tenants: list[Any]) -> None:
    dispatch("tests.chain", {}, tenant=tenants[2])
    drain()
    [parent], [child] = traces("chain"), traces("record")
    assert child["tenant"] == str(tenants[2].pk)
    assert child["corr"] == parent["corr"]


def test_redis_stalling_after_the_row_was_written_leaves_no_row(
    settings: Any, redis_writes_paused: Any
) -> None:
    """Real Redis, paused for writes: the overlapped dispatch has written its row when the read
    times out, and deletes it again. (The paused command runs when the pause ends, so a worker
    would still run the job and record it: a timeout's outcome is unknown, and the error says so.)"""
    from kumiko_jobs import pushing

    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "REDIS_TIMEOUT": 0.2}
    pushing._registered_queues.add(get_keys().queue("worker"))  # no SADD before the push
    get_keys()  # built before the pause
    with redis_writes_paused(600):
        with pytest.raises(QueueUnavailable, match=r"did not answer within 0\.2s"):
            dispatch("tests.record", {"n": 1})
        assert not JobRun.objects.exists()
