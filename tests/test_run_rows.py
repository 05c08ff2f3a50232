"""Run rows written without the ORM (run_rows.py): every path writes what the model would."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from kumiko_jobs import dispatch, records, run_rows
from kumiko_jobs.attempt_records import Started
from kumiko_jobs.connection import get_keys
from kumiko_jobs.dispatching import record_pushes
from kumiko_jobs.fanout import run_fan_out
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.preparing import prepare
from kumiko_jobs.pushing import Pushed
from kumiko_jobs.registry import registry
from kumiko_jobs.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _rows(count: int, *, tag: str = "r", **meta: Any) -> list[run_rows.RunRow]:
    rows = []
    for n in range(count):
        m = JobMeta(
            run_id=str(uuid.uuid4()),
            job_name="tests.record",
            lane="worker",
            tenant_id=str(n),
            subject=f"s{n}",
            tenant_visible=True,
            scheduled_at=NOW.timestamp(),
            **meta,
        )
        rows.append(
            run_rows.new_run_row(
                meta=m,
                job_id=f"{tag}-{n}",
                payload={"n": n, "text": "ü'\"", "list": [1, None, True]},
                queued_at=NOW,
                next_attempt_at=NOW + timedelta(seconds=n),
                retry_of=uuid.UUID(int=n) if n % 2 else None,
            )
        )
    return rows


def _expected(row: run_rows.RunRow) -> dict[str, Any]:
    return {
        "job_id": row.job_id,
        "tenant_id": row.tenant_id,
        "status": "queued",
        "payload": row.payload,
        "subject": row.subject,
        "tenant_visible": True,
        "scheduled_at": NOW,
        "next_attempt_at": row.next_attempt_at,
        "retry_of": row.retry_of,
        "pushed_at": NOW,
        # The columns a new run never sets hold the model's defaults.
        "logs": [],
        "error": "",
        "worker": "",
        "result": None,
        "defer_count": 0,
        "fanout_count": None,
        "started_at": None,
    }


def _stored(job_ids: list[str]) -> list[dict[str, Any]]:
    fields = list(_expected(_rows(1)[0]))
    by_id = {r["job_id"]: r for r in JobRun.objects.filter(job_id__in=job_ids).values(*fields)}
    return [by_id.get(job_id, {}) for job_id in job_ids]


@pytest.mark.parametrize("count", [1, 5, run_rows.COPY_FROM + 20])
def test_inserted_rows_read_back_as_the_model_would_write_them(count: int) -> None:
    # 1: the dispatch statement; 5: one multi-row INSERT; COPY_FROM + 20: COPY on PostgreSQL.
    rows = _rows(count)
    records.insert_queued(rows)
    assert _stored([r.job_id for r in rows]) == [_expected(r) for r in rows]


def test_rows_that_exist_are_left_alone_by_every_path() -> None:
    first = _rows(run_rows.COPY_FROM, tag="x")
    records.insert_queued(first[:3])
    JobRun.objects.filter(job_id=first[0].job_id).update(status=RunStatus.RUNNING, worker="w1")
    records.insert_queued(first)  # COPY path on PostgreSQL: the conflicts are skipped, not raised
    records.insert_queued(first[:2])  # multi-row INSERT
    records.insert_queued(first[:1])  # single row
    assert JobRun.objects.filter(job_id__startswith="x-").count() == run_rows.COPY_FROM
    assert JobRun.objects.filter(job_id=first[0].job_id).values_list("status", "worker").get() == (
        "running",
        "w1",
    )


def test_two_copies_in_one_transaction_insert_both_sets() -> None:
    a, b = _rows(run_rows.COPY_FROM, tag="a"), _rows(run_rows.COPY_FROM, tag="b")
    with transaction.atomic():
        records.insert_queued(a)
        records.insert_queued(b)
    assert JobRun.objects.filter(job_id__startswith="a-").count() == run_rows.COPY_FROM
    assert JobRun.objects.filter(job_id__startswith="b-").count() == run_rows.COPY_FROM


def test_the_copy_path_is_taken_on_postgresql() -> None:
    with connection.cursor() as cursor:
        assert run_rows.can_copy(cursor) == (connection.vendor == "postgresql")


def _stages(run: Callable[[], object]) -> bool:
    """Whether ``run`` sent rows through the temporary table: the statement that creates it is
    executed on that path only (read through Django's cursors, so committed work counts too)."""
    statements: list[str] = []

    def collect(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(collect):
        run()
    return any(sql.startswith("CREATE TEMPORARY TABLE") for sql in statements)


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="COPY is PostgreSQL's")
def test_a_copy_goes_straight_into_the_table_and_through_the_stage_only_on_a_conflict() -> None:
    fresh, clashing = _rows(run_rows.COPY_FROM, tag="f"), _rows(run_rows.COPY_FROM, tag="c")
    records.insert_queued(clashing[-1:])
    with transaction.atomic():
        assert not _stages(lambda: records.insert_queued(fresh))
        # Its last row exists: the savepoint rolls back, and the rows are staged.
        assert _stages(lambda: records.insert_queued(clashing))
    stored = JobRun.objects.filter(job_id__regex=r"^[fc]-").values_list("job_id", flat=True)
    assert sorted(stored) == sorted(r.job_id for r in fresh + clashing)


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="COPY is PostgreSQL's")
def test_rows_written_after_their_push_go_through_the_stage_at_once() -> None:
    rows = _rows(run_rows.COPY_FROM, tag="p")
    with transaction.atomic():
        # Workers may have written some already.
        assert _stages(lambda: records.insert_queued(rows, after_push=True))
    assert JobRun.objects.filter(job_id__startswith="p-").count() == run_rows.COPY_FROM


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="COPY is PostgreSQL's")
def test_a_copy_that_breaks_a_constraint_raises_and_writes_nothing() -> None:
    rows = _rows(run_rows.COPY_FROM, tag="k")
    rows[3].lane = None  # type: ignore[assignment]  # NOT NULL: no staging can mend that
    with pytest.raises(IntegrityError, match='"lane"'):
        records.insert_queued(rows)
    assert not JobRun.objects.filter(job_id__startswith="k-").exists()


def _wrapper(settings: Any, redis_client: Any) -> tuple[JobMeta, Started]:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "ACTIVE_TENANTS": "tests.testapp.tenants.many"}
    wrapper = dispatch("tests.per_tenant", {"x": 1})
    assert wrapper.job_id is not None
    meta = JobMeta.from_json(redis_client.hget(get_keys().job(wrapper.job_id), "meta"))
    return meta, Started(wrapper.job_id, {"x": 1}, "w", datetime.now(UTC))


def later(start: Started) -> Started:
    """The failed wrapper run again (an operator's requeue: the same attempt, started later; an
    attempt's writes refuse a record that finished after the attempt started)."""
    return dataclasses.replace(start, at=datetime.now(UTC))


def test_a_fan_out_without_redis_records_no_children_and_its_retry_reaches_everyone(
    settings: Any, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    meta, start = _wrapper(settings, redis_client)
    monkeypatch.setattr("kumiko_jobs.fanout.WRAPPER_ATTEMPTS", 1)  # one attempt, run again by hand
    working = settings.KUMIKO_JOBS
    settings.KUMIKO_JOBS = {**working, "REDIS_URL": "redis://127.0.0.1:1/0", "REDIS_TIMEOUT": 0.5}
    outcome = run_fan_out(meta, start, "tests.per_tenant")
    assert outcome.counted_as == "failed"
    assert not JobRun.objects.filter(job_name="tests.per_tenant").exists()
    assert "did not answer" in JobRun.objects.get(pk=meta.run_id).error
    settings.KUMIKO_JOBS = working
    run_fan_out(meta, later(start), "tests.per_tenant")
    assert JobRun.objects.filter(job_name="tests.per_tenant").count() == 150
    # The wrapper, still queued, runs once more and finds every child recorded.
    assert drain() == {"succeeded": 151}


def test_a_fan_out_whose_push_stalls_deletes_the_rows_it_wrote_meanwhile(
    settings: Any, redis_client: Any, redis_writes_paused: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows are written while Redis (paused for writes) holds the push: the read times out,
    they are deleted. The paused push runs when the pause ends; the retry then finds the
    children in Redis ("duplicate") and records each once."""
    meta, start = _wrapper(settings, redis_client)
    monkeypatch.setattr("kumiko_jobs.fanout.WRAPPER_ATTEMPTS", 1)  # one attempt, run again by hand
    working = settings.KUMIKO_JOBS
    settings.KUMIKO_JOBS = {**working, "REDIS_TIMEOUT": 0.2}
    with redis_writes_paused(600):
        outcome = run_fan_out(meta, start, "tests.per_tenant")
        assert outcome.counted_as == "failed"
        assert not JobRun.objects.filter(job_name="tests.per_tenant").exists()
    # The usual timeout again: another test's pause (they take turns) may hold writes 600 ms.
    settings.KUMIKO_JOBS = working
    run_fan_out(meta, later(start), "tests.per_tenant")
    assert JobRun.objects.filter(job_name="tests.per_tenant").count() == 150
    assert drain() == {"succeeded": 151}


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="COPY is PostgreSQL's")
def test_runs_recorded_after_their_push_are_staged() -> None:
    """record_pushes writes the rows of runs Redis accepted already (emit() to many listeners):
    workers may have written some, so the COPY goes through the temporary table at once."""
    definition = registry.get("tests.record")
    prepared = [
        prepare(definition, {"n": n}, tenant_id=str(n), user_id=None) for n in range(run_rows.COPY_FROM)
    ]
    assert _stages(
        lambda: record_pushes(prepared, [Pushed("queued")] * len(prepared), rows_exist=False, announce=False)
    )
    assert JobRun.objects.filter(pk__in=[p.row.id for p in prepared]).count() == run_rows.COPY_FROM


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="COPY is PostgreSQL's")
@pytest.mark.parametrize(
    ("target", "staged"),
    [
        ("tests.per_tenant", False),  # rows written while Redis runs the push: straight in
        ("tests.per_tenant_limited", True),  # pushed first (skip limits), then written: staged
    ],
)
def test_a_fan_out_stages_its_rows_only_when_it_writes_them_after_the_push(
    settings: Any, redis_client: Any, target: str, staged: bool
) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "ACTIVE_TENANTS": "tests.testapp.tenants.many"}
    wrapper = dispatch(target, {})
    assert wrapper.job_id is not None
    meta = JobMeta.from_json(redis_client.hget(get_keys().job(wrapper.job_id), "meta"))
    start = Started(wrapper.job_id, {}, "w", datetime.now(UTC))
    assert _stages(lambda: run_fan_out(meta, start, target)) == staged
    assert JobRun.objects.filter(job_name=target).count() == 150


def test_a_replace_fan_out_drops_the_waiting_children_of_the_last_one(
    settings: Any, redis_client: Any, tenants: list[Any]
) -> None:
    """per_tenant + concurrency="replace": each fan-out's child replaces its tenant's waiting
    one, and that one's row must say dropped at once (it said queued until repair, with the
    wrong note and no job_dropped)."""
    from kumiko_jobs.registry import build_definition
    from tests.testapp.jobs import replacing

    settings.KUMIKO_JOBS = {
        **settings.KUMIKO_JOBS,
        "ACTIVE_TENANTS": "project.demo.tenants.active_tenant_ids",
    }
    with registry.isolated():
        registry.register(
            build_definition(replacing, "tests.pt_replace", {"per_tenant": True, "concurrency": "replace"})
        )
        for n in (1, 2):
            wrapper = dispatch("tests.pt_replace", {"n": n})
            meta = JobMeta.from_json(redis_client.hget(get_keys().job(wrapper.job_id), "meta"))
            run_fan_out(meta, Started(wrapper.job_id, {"n": n}, "w", datetime.now(UTC)), "tests.pt_replace")
        children = JobRun.objects.filter(job_name="tests.pt_replace")
        by_payload = {(row.payload["n"], row.status) for row in children}
        assert by_payload == {(1, RunStatus.DROPPED), (2, RunStatus.QUEUED)}
        assert children.filter(status=RunStatus.DROPPED).count() == len(tenants)


def test_the_suites_rule_check_reports_a_run_that_breaks_a_rule() -> None:
    """The run table has no CHECK constraints; tests/run_invariants.py checks the rows each test
    leaves instead (tests/conftest.py): it must see each of the seven rules broken."""
    from tests.run_invariants import runs_breaking_the_rules

    row = _rows(1, tag="r")[0]
    records.insert_queued([row])
    assert runs_breaking_the_rules() == []
    run = JobRun.objects.filter(pk=row.id)
    broken = [
        {"status": "lost"},
        {"attempt": 0},
        {"max_attempts": -1},
        {"defer_count": -1},
        {"fanout_count": -1},
        {"status": RunStatus.SUCCEEDED},
        {"status": RunStatus.FAILED},
        {"status": RunStatus.DROPPED},
    ]
    for values in broken:
        run.update(**values)
        assert [r[0] for r in runs_breaking_the_rules()] == [row.job_id], values
        run.update(status=RunStatus.QUEUED, attempt=1, max_attempts=1, defer_count=0, fanout_count=None)
    assert runs_breaking_the_rules() == []
