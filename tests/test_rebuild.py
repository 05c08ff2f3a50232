"""Redis as a rebuildable copy of the run table (rebuild.py): committed runs whose push never
happened, and lanes whose Redis lost its data, are pushed again from their records, once the
loss is confirmed (suspects.py): a run that just finished is gone from Redis too."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.rebuild import push_waiting, rebuild_step
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)
DEAD_REDIS = "redis://127.0.0.1:1/0"


def _age(**filters: Any) -> None:
    past = timezone.now() - timedelta(minutes=5)
    JobRun.objects.filter(**filters).update(queued_at=past, updated_at=past)


def _next_outbox_round(redis_client: Any) -> None:
    redis_client.delete(get_keys().outbox_lock("worker"))


def _start_rebuild(redis_client: Any, kumiko_prefix: str) -> None:
    """Redis restarts empty (every key of the deployment is gone), and the time a rebuild waits
    for pushes in flight has passed once it noticed."""
    keys = get_keys()
    redis_client.delete(*redis_client.scan_iter(match=f"*{kumiko_prefix}*"))
    assert rebuild_step(redis_client, keys, "worker") == 0  # noticed: waits for pushes in flight
    state = redis_client.get(keys.rebuild_state("worker"))
    assert state is not None
    past = (timezone.now() - timedelta(seconds=30)).isoformat()
    epoch, _started, rest = state.decode().split("|", 2)
    redis_client.set(keys.rebuild_state("worker"), f"{epoch}|{past}|{rest}")


def test_redis_down_at_commit_leaves_the_runs_waiting_and_the_outbox_pushes_them(
    settings: Any, redis_client: Any, traces: Any, tenants: list[Any], age_suspects: Any
) -> None:
    real = settings.KUMIKO_JOBS
    settings.KUMIKO_JOBS = {**real, "REDIS_URL": DEAD_REDIS, "REDIS_TIMEOUT": 0.2}
    with transaction.atomic():  # neither dispatch may raise out of the caller's atomic()
        first = dispatch("tests.record", {"n": 1}, tenant=tenants[0])
        second = dispatch("tests.record", {"n": 2}, tenant=tenants[1])
    settings.KUMIKO_JOBS = real
    rows = JobRun.objects.filter(pk__in=[first.run_id, second.run_id])
    assert {(r.status, r.pushed_at) for r in rows} == {(RunStatus.QUEUED, None)}
    assert push_waiting(redis_client, get_keys(), "worker") == 0  # within their grace
    _age(pk__in=[first.run_id, second.run_id])
    assert push_waiting(redis_client, get_keys(), "worker") == 0  # suspects: Redis lacks them
    assert age_suspects() == 2
    _next_outbox_round(redis_client)
    assert push_waiting(redis_client, get_keys(), "worker") == 2
    assert drain() == {"succeeded": 2}
    assert sorted(e["payload"]["n"] for e in traces("record")) == [1, 2]
    assert all(r.pushed_at is not None for r in rows.all())


def test_a_commit_whose_push_already_happened_is_only_marked(redis_client: Any, traces: Any) -> None:
    with transaction.atomic():
        result = dispatch("tests.record", {"n": 1})
    # The push after commit happened, but its "pushed" mark was lost (a crash right after it).
    JobRun.objects.filter(pk=result.run_id).update(pushed_at=None)
    _age(pk=result.run_id)
    assert push_waiting(redis_client, get_keys(), "worker") == 1  # Redis holds it: only marked
    assert drain() == {"succeeded": 1}
    assert len(traces("record")) == 1


def test_a_run_that_finished_before_its_marks_landed_is_not_pushed_again(
    redis_client: Any, traces: Any, age_suspects: Any
) -> None:
    with transaction.atomic():
        result = dispatch("tests.record", {"n": 1})
    assert drain() == {"succeeded": 1}
    # The outbox read the row before its "pushed" mark and its success's write landed; by the
    # time it asks Redis, the success has deleted the job.
    JobRun.objects.filter(pk=result.run_id).update(pushed_at=None, status=RunStatus.QUEUED)
    _age(pk=result.run_id)
    assert push_waiting(redis_client, get_keys(), "worker") == 0
    JobRun.objects.filter(pk=result.run_id).update(
        status=RunStatus.SUCCEEDED, pushed_at=timezone.now(), updated_at=timezone.now()
    )
    assert age_suspects() == 1
    _next_outbox_round(redis_client)
    assert push_waiting(redis_client, get_keys(), "worker") == 0
    assert age_suspects() == 0
    assert drain() == {}
    assert [e["payload"]["n"] for e in traces("record")] == [1]


def test_lane_is_rebuilt_from_records_after_redis_lost_its_data(
    redis_client: Any, traces: Any, tenants: list[Any], kumiko_prefix: str, age_suspects: Any
) -> None:
    keys = get_keys()
    assert rebuild_step(redis_client, keys, "worker") == 0  # first start: epoch set, nothing lost
    now_runs = [dispatch("tests.limited", {"n": n}, tenant=tenants[0]) for n in range(3)]
    later = dispatch("tests.record", {"n": "later"}, delay=3600)
    deferred = dispatch("tests.record", {"n": "deferred"})
    JobRun.objects.filter(pk=deferred.run_id).update(
        status=RunStatus.DEFERRED, next_attempt_at=timezone.now() + timedelta(hours=1)
    )
    JobRun.objects.update(updated_at=timezone.now() - timedelta(minutes=5))
    # Redis restarts empty: every key of the deployment is gone, limits and epoch included.
    _start_rebuild(redis_client, kumiko_prefix)
    assert sum(rebuild_step(redis_client, keys, "worker") for _ in range(5)) == 0  # suspects
    assert redis_client.get(keys.rebuilt("worker")) is None  # not done while any is unconfirmed
    assert age_suspects() == 5
    pushed = 0
    for _ in range(10):
        pushed += rebuild_step(redis_client, keys, "worker")
    assert pushed == 5
    assert redis_client.get(keys.rebuilt("worker")) == redis_client.get(keys.epoch)
    # The limit of tests.limited (3 per tenant) is counted again: a fourth is refused.
    assert dispatch("tests.limited", {}, tenant=tenants[0]).status == "skipped"
    assert drain(timeout=0.5) == {"succeeded": 3}
    assert sorted(e["payload"]["n"] for e in traces("limited_start")) == [0, 1, 2]
    scheduled = redis_client.zscore(keys.scheduled("worker"), later.job_id)
    assert scheduled is not None and scheduled > timezone.now().timestamp() + 3000
    assert redis_client.zscore(keys.scheduled("worker"), deferred.job_id) is not None
    assert [JobRun.objects.get(pk=r.run_id).status for r in now_runs] == [RunStatus.SUCCEEDED] * 3
    assert rebuild_step(redis_client, keys, "worker") == 0  # done for this epoch


def test_a_run_that_finishes_while_the_rebuild_looks_is_not_run_again(
    redis_client: Any, traces: Any, kumiko_prefix: str, age_suspects: Any
) -> None:
    keys = get_keys()
    assert rebuild_step(redis_client, keys, "worker") == 0
    result = dispatch("tests.record", {"n": 1})
    assert drain() == {"succeeded": 1}
    assert [e["payload"]["n"] for e in traces("record")] == [1]
    # The rebuild read the row (queued) before the success's write landed, and asked Redis after
    # the success had deleted the job.
    JobRun.objects.filter(pk=result.run_id).update(status=RunStatus.QUEUED)
    _age(pk=result.run_id)
    _start_rebuild(redis_client, kumiko_prefix)
    assert rebuild_step(redis_client, keys, "worker") == 0
    JobRun.objects.filter(pk=result.run_id).update(status=RunStatus.SUCCEEDED, updated_at=timezone.now())
    assert age_suspects() == 1
    assert sum(rebuild_step(redis_client, keys, "worker") for _ in range(3)) == 0
    assert redis_client.get(keys.rebuilt("worker")) == redis_client.get(keys.epoch)
    assert drain() == {}
    assert traces("record") == []  # not run again (the restart took the first trace with it)


def test_the_outbox_does_not_replace_a_newer_run_with_an_older_one(
    settings: Any, redis_client: Any, traces: Any, tenants: list[Any], age_suspects: Any
) -> None:
    """concurrency="replace" keeps the newest payload: a run committed while Redis was down,
    pushed by the outbox after a newer run of its flow was queued, is the one dropped."""
    real = settings.KUMIKO_JOBS
    settings.KUMIKO_JOBS = {**real, "REDIS_URL": DEAD_REDIS, "REDIS_TIMEOUT": 0.2}
    with transaction.atomic():
        older = dispatch("tests.replacing", {"n": 1}, tenant=tenants[0])
    settings.KUMIKO_JOBS = real
    newer = dispatch("tests.replacing", {"n": 2}, tenant=tenants[0])  # Redis is back
    _age(pk=older.run_id)
    assert push_waiting(redis_client, get_keys(), "worker") == 0
    assert age_suspects() == 1
    _next_outbox_round(redis_client)
    push_waiting(redis_client, get_keys(), "worker")
    assert drain() == {"succeeded": 1}
    assert [e["payload"]["n"] for e in traces("replacing_start")] == [2]
    dropped = JobRun.objects.get(pk=older.run_id)
    assert dropped.status == RunStatus.DROPPED
    assert dropped.error == f"Not enqueued: replaced by a newer run ({newer.job_id})"
    assert JobRun.objects.get(pk=newer.run_id).status == RunStatus.SUCCEEDED


def test_the_outbox_compares_dispatch_times_not_run_ids(
    settings: Any, redis_client: Any, traces: Any, tenants: list[Any], age_suspects: Any
) -> None:
    """Cron ticks and fan-out children have name-based run ids, which do not sort by time: an
    older run whose id sorts higher is still the older one."""
    import uuid

    real = settings.KUMIKO_JOBS
    settings.KUMIKO_JOBS = {**real, "REDIS_URL": DEAD_REDIS, "REDIS_TIMEOUT": 0.2}
    with transaction.atomic():
        older = dispatch("tests.replacing", {"n": 1}, tenant=tenants[0])
    settings.KUMIKO_JOBS = real
    high = uuid.UUID("ffffffff-ffff-5fff-bfff-ffffffffffff")  # a uuid5-like id, sorting last
    JobRun.objects.filter(pk=older.run_id).update(id=high)
    newer = dispatch("tests.replacing", {"n": 2}, tenant=tenants[0])
    _age(pk=high)
    push_waiting(redis_client, get_keys(), "worker")
    assert age_suspects() == 1
    _next_outbox_round(redis_client)
    push_waiting(redis_client, get_keys(), "worker")
    assert drain() == {"succeeded": 1}
    assert [e["payload"]["n"] for e in traces("replacing_start")] == [2]
    assert JobRun.objects.get(pk=high).status == RunStatus.DROPPED
    assert JobRun.objects.get(pk=newer.run_id).status == RunStatus.SUCCEEDED


def test_a_lost_hash_refused_as_replaced_gives_back_its_skip_limit(
    redis_client: Any, tenants: list[Any]
) -> None:
    """A run pushed again after Redis lost its hash (its skip limits still counted from its
    first push) and refused because a newer run of its flow waits: it never ends, so the
    refusal gives its limits back."""
    from kumiko_jobs.lane import Claim, finish_and_claim
    from kumiko_jobs.rebuild import repush
    from kumiko_jobs.registry import build_definition, registry
    from tests.testapp.jobs import replacing

    tenant = str(tenants[0].pk)
    with registry.isolated():
        registry.register(
            build_definition(replacing, "tests.replace_two", {"concurrency": "replace", "max_per_tenant": 2})
        )
        older = dispatch("tests.replace_two", {"n": 1}, tenant=tenant)
        claimed = finish_and_claim(redis_client, get_keys(), "worker", claim=Claim("w", "x", 9e9))
        assert claimed is not None and claimed.job_id == older.job_id  # running: still counted
        newer = dispatch("tests.replace_two", {"n": 2}, tenant=tenant)
        active = get_keys().active
        [key] = [k for k in redis_client.hkeys(active) if tenant.encode() in k]
        assert int(redis_client.hget(active, key)) == 2
        redis_client.delete(get_keys().job(older.job_id))  # its hash is lost
        assert repush(redis_client, [JobRun.objects.get(pk=older.run_id)], admit=False) == 0
        assert int(redis_client.hget(active, key)) == 1  # the newer run's count only
        assert JobRun.objects.get(pk=older.run_id).status == RunStatus.DROPPED
        assert JobRun.objects.get(pk=newer.run_id).status == RunStatus.QUEUED


def test_a_run_is_prepared_again_from_the_fields_its_batch_read(django_assert_num_queries: Any) -> None:
    """Rows are read with ROW_FIELDS only: a field outside them costs a query per row, 500 in a
    rebuild batch, at the moment Redis came back empty."""
    from kumiko_jobs.rebuild import ROW_FIELDS, _prepared

    result = dispatch("tests.record", {"n": 1})
    row = JobRun.objects.only(*ROW_FIELDS).get(pk=result.run_id)
    with django_assert_num_queries(0):
        assert _prepared(row, admit=True) is not None


def test_runs_of_undeclared_jobs_do_not_hold_up_the_outbox(
    settings: Any, redis_client: Any, traces: Any, age_suspects: Any, monkeypatch: Any
) -> None:
    """Committed runs of a job this process does not declare (removed, or not deployed here yet)
    cannot be pushed: they filled the outbox's batch for good, and newer runs waited behind."""
    monkeypatch.setattr("kumiko_jobs.rebuild.BATCH", 2)
    real = settings.KUMIKO_JOBS
    settings.KUMIKO_JOBS = {**real, "REDIS_URL": DEAD_REDIS, "REDIS_TIMEOUT": 0.2}
    with transaction.atomic():
        gone = [dispatch("tests.record", {"n": n}) for n in range(2)]
        kept = dispatch("tests.record", {"n": 9})
    settings.KUMIKO_JOBS = real
    JobRun.objects.filter(pk__in=[r.run_id for r in gone]).update(job_name="tests.removed_since")
    _age(pk__in=[r.run_id for r in [*gone, kept]])
    JobRun.objects.filter(pk=kept.run_id).update(queued_at=timezone.now() - timedelta(minutes=4))
    push_waiting(redis_client, get_keys(), "worker")  # suspects: Redis lacks them
    age_suspects()
    _next_outbox_round(redis_client)
    assert push_waiting(redis_client, get_keys(), "worker") == 1
    assert drain() == {"succeeded": 1}
    assert [e["payload"]["n"] for e in traces("record")] == [9]


def test_the_outbox_pushes_a_task_its_process_imports_only_on_first_use(
    settings: Any, redis_client: Any, age_suspects: Any, monkeypatch: Any
) -> None:
    """A Django task outside TASK_MODULE is registered when a process first meets its name (the
    task resolver): the outbox of a worker that never ran one still pushes its waiting runs."""
    from kumiko_jobs.registry import registry
    from tests.testapp.lazy_tasks import lazy

    real = settings.KUMIKO_JOBS
    settings.KUMIKO_JOBS = {**real, "REDIS_URL": DEAD_REDIS, "REDIS_TIMEOUT": 0.2}
    with transaction.atomic():
        result = lazy.enqueue(1)  # committed; its push after commit meets a dead Redis
    settings.KUMIKO_JOBS = real
    # This process as a worker that never imported the task's module.
    monkeypatch.delitem(registry._jobs, lazy.module_path)
    _age(pk=result.id)
    keys = get_keys()
    push_waiting(redis_client, keys, "api")  # a suspect: Redis lacks it
    assert age_suspects() == 1
    redis_client.delete(keys.outbox_lock("api"))
    assert push_waiting(redis_client, keys, "api") == 1
    assert drain() == {"succeeded": 1}
    assert lazy.get_result(result.id).return_value == 2
