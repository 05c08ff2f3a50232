"""Hot-path writes through libpq's pipeline (pg_pipeline.py): what the cursor path writes, an async
commit confined to its statement, prepared statements that may vanish, errors as Django's."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import IntegrityError, ProgrammingError, connection

from kumiko_jobs import guarded_writes, pg_pipeline, records, run_rows, run_updates
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.models import JobRun, RunStatus

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="libpq's pipeline is PostgreSQL's"),
]

NOW = datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=UTC)


def _row(tag: str) -> run_rows.RunRow:
    meta = JobMeta(
        run_id=str(uuid.uuid4()),
        job_name="tests.record",
        lane="worker",
        tenant_id="7",
        triggered_by="42",
        trigger_name="nightly",
        subject="invoice-9",
        tenant_visible=True,
        scheduled_at=NOW.timestamp(),
        zone="Europe/Berlin",
        fanout_parent="parent-1",
    )
    return run_rows.new_run_row(
        meta=meta,
        job_id=f"{tag}-job",
        payload={"text": "ü'\"\\ ; DROP TABLE x; --", "n": 1.5, "list": [1, None, True], "nested": {}},
        queued_at=NOW,
        next_attempt_at=NOW,
        retry_of=uuid.uuid4(),
    )


@contextmanager
def _seen_by_a_wrapper() -> Iterator[list[str]]:
    """An execute wrapper, as instrumentation installs one: the statements it saw."""
    seen: list[str] = []

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield seen


def _columns(job_id: str) -> dict[str, Any]:
    values = JobRun.objects.filter(job_id=job_id).values().get()
    return {k: v for k, v in values.items() if k not in ("id", "job_id", "retry_of", "correlation_id")}


def test_a_row_sent_through_the_pipeline_is_the_row_a_cursor_writes() -> None:
    piped, cursor = _row("piped"), _row("cursor")
    records.insert_queued([piped])
    with _seen_by_a_wrapper() as seen:
        records.insert_queued([cursor])  # instrumented: the cursor path, so the wrapper sees it
    assert len(seen) == 1 and "INSERT" in seen[0]
    assert _columns("piped-job") == _columns("cursor-job")
    stored = JobRun.objects.get(job_id="piped-job")
    assert (stored.payload, stored.scheduled_at, stored.retry_of) == (piped.payload, NOW, piped.retry_of)


def test_an_update_sent_through_the_pipeline_writes_every_kind_of_value() -> None:
    row = _row("update")
    records.insert_queued([row])
    logs = [{"at": "09:30", "msg": "ünïcødé 'quoted'"}]
    changed = run_updates.update_run(
        row.id,
        status=RunStatus.SUCCEEDED,
        finished_at=NOW,
        logs=logs,
        result={"total": 3, "ok": True},
        error="",
        defer_count=2,
        tenant_visible=False,
        fanout_count=None,
    )
    assert changed == 1
    stored = JobRun.objects.values(
        "status", "finished_at", "logs", "result", "defer_count", "tenant_visible", "fanout_count"
    ).get(pk=row.id)
    assert stored == {
        "status": "succeeded",
        "finished_at": NOW,
        "logs": logs,
        "result": {"total": 3, "ok": True},
        "defer_count": 2,
        "tenant_visible": False,
        "fanout_count": None,
    }
    assert run_updates.update_run(uuid.uuid4(), error="no such run") == 0


def test_the_async_commit_applies_to_its_own_statement_only() -> None:
    inside = b"SELECT 1 WHERE current_setting('synchronous_commit') = 'off'"
    assert pg_pipeline.execute(connection, inside, []) == 1
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone() == ("on",)


def test_an_answer_still_to_come_is_waited_for_with_the_other_threads_running() -> None:
    """The answer is read at once when it is there (a dispatch's, after Redis'); one still to
    come is waited for in select(), where the GIL is free: libpq's own wait would hold it, and a
    worker's other job threads with it."""
    ticks, done = 0, threading.Event()

    def tick() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    started = time.monotonic()
    pending = pg_pipeline.send(connection, b"SELECT pg_sleep($1)", [b"0.3"])
    ticker.start()
    try:
        assert pending.wait() == 1
    finally:
        done.set()
        ticker.join()
    assert time.monotonic() - started >= 0.3
    assert ticks >= 50  # ~1 ms a tick: about 300 if nothing held the GIL
    assert pg_pipeline.execute(connection, b"SELECT 1", []) == 1  # the connection is ready again


def test_an_answer_already_there_is_read_without_a_select(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dispatch's answer is nearly always in by the time it is read (after Redis'): read at
    once, without the select() system call first."""
    pending = pg_pipeline.send(connection, b"SELECT 1", [])
    time.sleep(0.05)

    def no_select(*args: Any) -> Any:
        raise AssertionError("select() on an answer that was there")

    monkeypatch.setattr(pg_pipeline.select, "select", no_select)
    assert pending.wait() == 1


def test_a_prepared_statement_the_connection_lost_is_sent_again_unprepared(
    caplog: pytest.LogCaptureFixture,
) -> None:
    row = _row("lost")
    records.insert_queued([row])  # prepares the INSERT on this connection
    psycopg_connection = connection.connection
    assert pg_pipeline._prepared[psycopg_connection]
    with connection.cursor() as cursor:
        # What a pooler in transaction mode does to a session's prepared statements.
        cursor.execute("DEALLOCATE ALL")
    try:
        records.insert_queued([_row("again")])  # no error: sent again unprepared
        assert JobRun.objects.filter(job_id="again-job").exists()
        assert connection.connection is psycopg_connection  # kept: nothing was wrong with it
        assert connection.alias in pg_pipeline._unprepared  # and its alias prepares no more
        connection.close()
        records.insert_queued([_row("third")])  # a new connection: unprepared from the start
        assert JobRun.objects.filter(job_id="third-job").exists()
        assert not pg_pipeline._prepared.get(connection.connection)
        # Said once, as a warning naming the alias and the cure.
        said = [r.getMessage() for r in caplog.records if "prepared statement went missing" in r.getMessage()]
        assert len(said) == 1
        assert f"database {connection.alias!r}" in said[0]
        assert "max_prepared_statements" in said[0]
    finally:
        pg_pipeline._unprepared.discard(connection.alias)


def test_a_failing_statement_raises_djangos_error_and_leaves_the_connection_usable() -> None:
    row = _row("failing")
    records.insert_queued([row])
    psycopg_connection = connection.connection
    with pytest.raises(IntegrityError, match='"lane"'):
        run_updates.update_run(row.id, lane=None)  # NOT NULL
    assert run_updates.update_run(row.id, lane="api") == 1  # the same statement, a good value
    assert connection.connection is psycopg_connection
    assert JobRun.objects.get(pk=row.id).lane == "api"


def test_a_connection_left_inside_a_transaction_is_not_written_through() -> None:
    row = _row("open")
    records.insert_queued([row])
    # A job opened a transaction behind Django's back (autocommit still on as Django sees it).
    connection.connection.execute("BEGIN")
    connection.connection.execute("UPDATE kumiko_jobs_jobrun SET worker = 'uncommitted junk'")
    assert guarded_writes.safe(run_updates.update_run, row.id, error="written")
    stored = JobRun.objects.values_list("error", "worker").get(pk=row.id)
    assert stored == ("written", "")  # the junk was rolled back with the replaced connection


def test_parameters_of_other_types_are_refused_not_guessed() -> None:
    assert pg_pipeline.text(RunStatus.QUEUED) == b"queued"
    assert pg_pipeline.text(uuid.UUID(int=1)) == b"00000000000000000000000000000001"
    with pytest.raises(TypeError, match="no PostgreSQL text form for a parameter of type bytes"):
        pg_pipeline.text(b"raw")


def test_a_statement_that_cannot_be_prepared_fails_as_itself_and_changes_nothing_else() -> None:
    with pytest.raises(ProgrammingError, match="nope"):
        pg_pipeline.execute(connection, b"UPDATE kumiko_jobs_jobrun SET nope = $1", [b"x"])
    assert connection.alias not in pg_pipeline._unprepared  # a bad statement is no pooler
    row = _row("after-bad")
    records.insert_queued([row])
    assert JobRun.objects.filter(job_id="after-bad-job").exists()


def test_a_nul_in_a_text_value_is_stored_replaced_not_cut_off() -> None:
    row = _row("nul")
    records.insert_queued([row])
    assert run_updates.update_run(row.id, error="before\x00after", traceback="tb") == 1
    assert JobRun.objects.values_list("error", "traceback").get(pk=row.id) == ("before\ufffdafter", "tb")


def _prepared_here(on: Any = connection) -> list[str]:
    """The names of our statements prepared on the session of ``on`` (a Django connection)."""
    with on.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'kumiko_%%'")
        return [name for (name,) in cursor.fetchall()]


def test_pipelined_writes_off_sends_them_through_a_cursor(settings: Any) -> None:
    connection.close()  # a fresh session: nothing prepared on it yet
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "PIPELINED_WRITES": False}
    off = _row("off")
    records.insert_queued([off])
    run_updates.update_run(off.id, error="through a cursor")
    assert _prepared_here() == []
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "PIPELINED_WRITES": True}
    records.insert_queued([_row("on")])
    assert len(_prepared_here()) == 2  # set_config and the INSERT, prepared on this session
    assert JobRun.objects.get(job_id="off-job").error == "through a cursor"


def test_a_new_connection_prepares_in_the_pipeline_and_a_name_the_session_holds_is_reused() -> None:
    connection.close()
    records.insert_queued([_row("first")])  # a new session: the Parse goes out with the statement
    assert len(_prepared_here()) == 2
    # A session with our names but a new client (a pooler's server connection in session mode):
    # each Parse answers 42P05, and the statements are sent again without it.
    held = _prepared_here()
    pg_pipeline._prepared.pop(connection.connection)
    records.insert_queued([_row("held")])
    assert sorted(_prepared_here()) == sorted(held)
    assert len(pg_pipeline._prepared[connection.connection]) == 2
    assert JobRun.objects.filter(job_id__in=["first-job", "held-job"]).count() == 2
    assert connection.alias not in pg_pipeline._unprepared


def test_a_statement_failing_on_a_new_connection_leaves_its_names_prepared() -> None:
    row = _row("check")
    records.insert_queued([row])
    connection.close()
    with pytest.raises(IntegrityError, match='"lane"'):
        run_updates.update_run(row.id, lane=None)  # the Parses succeeded, the UPDATE (NOT NULL) did not
    assert len(pg_pipeline._prepared[connection.connection]) == 2
    assert len(_prepared_here()) == 2
    assert run_updates.update_run(row.id, lane="api") == 1  # its prepared name, used again
    assert len(_prepared_here()) == 2
    assert JobRun.objects.get(pk=row.id).lane == "api"


def test_writes_through_djangos_connection_pool_keep_their_prepared_statements() -> None:
    """Django's pool (``"OPTIONS": {"pool": ...}``, psycopg-pool) hands the same session back:
    the statements prepared on it are used again, not lost (which would switch the alias to
    unprepared writes, as behind PgBouncer in transaction mode)."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    options = {**connection.settings_dict["OPTIONS"], "pool": {"min_size": 1, "max_size": 1}}
    pooled = DatabaseWrapper({**connection.settings_dict, "OPTIONS": options}, alias="kj_pooled")
    try:
        assert pg_pipeline.available(pooled)
        sql = b"INSERT INTO kumiko_jobs_jobrun SELECT * FROM kumiko_jobs_jobrun WHERE FALSE"
        assert pg_pipeline.execute(pooled, sql, []) == 0
        session = pooled.connection
        pooled.close()  # back to the pool, as at the end of a request
        pooled.ensure_connection()
        assert pooled.connection is session
        assert pg_pipeline.execute(pooled, sql, []) == 0
        assert "kj_pooled" not in pg_pipeline._unprepared
        assert len(_prepared_here(pooled)) == 2
    finally:
        pg_pipeline._unprepared.discard("kj_pooled")
        pooled.close()
        pooled.close_pool()


def _rollbacks() -> int:
    """This database's aborted transactions, as the statistics have them (a closed session's
    counts are flushed when its backend exits)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        row = cursor.fetchone()
        assert row is not None
        return int(row[0])


def _wait_until_gone(sql: str, pid: int) -> None:
    """Until no client backend of this database matches ``sql`` (a condition on pid and the
    parameter ``pid``): exited, and so flushed its statistics."""
    deadline = time.monotonic() + 10
    query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(query + "backend_type = 'client backend' AND " + sql, [pid])
            if cursor.fetchone() == (0,):
                return
        time.sleep(0.02)
    raise AssertionError(f"backends where {sql % pid} did not exit")


def test_a_batch_repeating_one_statement_prepares_it_once_on_a_new_connection() -> None:
    """A writer's batch sends the same UPDATE for each success: one Parse, not one each (a second
    Parse of the name would fail, abort the batch and send it again)."""
    rows = [_row(f"batch-{n}") for n in range(3)]
    records.insert_queued(rows)
    sql = b"UPDATE kumiko_jobs_jobrun SET error = $1 WHERE id = $2"
    connection.close()
    connection.ensure_connection()
    session = connection.connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone() or (0,)
    _wait_until_gone("pid <> %s", pid)  # earlier sessions' aborted transactions are counted
    before = _rollbacks()
    statements = [(sql, [f"batch {n}".encode(), row.id.hex.encode()]) for n, row in enumerate(rows)]
    assert pg_pipeline.send_all(connection, statements).wait_all() == [1, 1, 1]
    assert len(pg_pipeline._prepared[session]) == 2
    connection.close()  # its backend flushes its counts as it exits, before it leaves pg_stat_activity
    _wait_until_gone("pid = %s", pid)
    assert _rollbacks() == before
    assert sorted(JobRun.objects.filter(job_id__startswith="batch-").values_list("error", flat=True)) == [
        "batch 0",
        "batch 1",
        "batch 2",
    ]
