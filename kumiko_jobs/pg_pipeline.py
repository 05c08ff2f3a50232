"""One hot-path statement on PostgreSQL, sent through libpq without waiting for its answer.

The run writes on the hot path (a dispatch's INSERT, a worker's outcome UPDATE) are single
statements outside any transaction, committed without waiting for the WAL flush. Sent through
a Django cursor, psycopg's client-side binding quotes each of the ~30 parameters in Python,
PostgreSQL parses and plans the 33-column INSERT again (~110 us of its ~320), and the caller
sits idle meanwhile: together more than RQ's whole enqueue. Here the statement and a
``set_config('synchronous_commit', 'off', true)`` are prepared once per connection (the Parse
goes out in the same pipeline as their first use) and go out in libpq's pipeline mode, the
setting first, then the statement with text parameters, and one
Sync: one implicit transaction, so the setting ends with it, and one round trip. ``send`` returns at once: a
dispatch pushes to Redis while PostgreSQL inserts its row. (``SET LOCAL`` would apply too, but
the server answers it with a WARNING on every statement outside an explicit transaction.)

Used only where nothing else expects to see the statement: PostgreSQL through psycopg 3 (not
psycopg2), outside ``atomic()``, no execute wrappers (OpenTelemetry's SQL commenter installs
one) and no query logging (DEBUG, which django-debug-toolbar reads); otherwise ``available``
says no and the caller uses a cursor. Tools that patch the cursor class or the driver (Sentry's
Django integration) do not see these statements; ``PIPELINED_WRITES = False`` sends them
through a cursor too.

``send_all`` sends several statements the same way in one transaction (one Sync): a worker's
writer thread writes the successes of its job threads so (success_writes.py).

Prepared statements are named after their SQL's hash. Where one goes missing (a pooler such as
PgBouncer in transaction mode hands the session to another server connection: "prepared
statement does not exist"), nothing ran, so the statement is sent again unprepared, and that
database alias prepares nothing more in this process. Where a name is there already (a session
another client prepared it on), the Parse fails with 42P05 and nothing ran: the name is known
from then on, and the statements are sent again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import select
import threading
import uuid
import weakref
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import cache, lru_cache
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from kumiko_jobs.conf import get_config

logger = logging.getLogger("kumiko_jobs")

_ASYNC_COMMIT = b"SELECT set_config('synchronous_commit', 'off', true)"
# SQLSTATEs: a name prepared already (ours: names are hashes of the SQL), and one that is gone.
_DUPLICATE_PREPARED = b"42P05"
_UNKNOWN_PREPARED = b"26000"
# Per psycopg connection: the names prepared on it.
_prepared: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()
# Database aliases whose prepared statements went missing (a pooler between us and the server):
# their connections, new ones too, send statements unprepared for the rest of the process.
_unprepared: set[str] = set()
# Job threads of one worker can find out at the same instant: the warning is said once.
_unprepared_lock = threading.Lock()


def available(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``send`` may take this connection's next statement."""
    return (
        connection.vendor == "postgresql"
        and get_config()["PIPELINED_WRITES"] is True
        and not connection.in_atomic_block
        and not connection.execute_wrappers
        and not connection.queries_logged
        and is_psycopg3()
        and connection.get_autocommit()
    )


@cache
def is_psycopg3() -> bool:
    """Django's PostgreSQL backend runs on psycopg 3 (libpq's pipeline) or psycopg2 (cursor)."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3 as django_is_psycopg3

    return bool(django_is_psycopg3)


Statement = tuple[bytes, Sequence[bytes | None]]  # SQL with $n placeholders, text parameters


class Pending:
    """Statements sent and not yet answered; ``wait()`` reads their answer (exactly once)."""

    __slots__ = ("_connection", "_parsing", "_pgconn", "_preparing", "_statements")

    def __init__(
        self,
        connection: BaseDatabaseWrapper,
        pgconn: Any,
        statements: Sequence[Statement],
        preparing: Sequence[bytes | None] | None,
        *,
        parsing: bool,
    ) -> None:
        self._connection, self._pgconn = connection, pgconn
        # Per result to come: the name a Parse prepares, or None for a statement's own result;
        # None when the statements went out unprepared.
        self._statements, self._preparing = statements, preparing
        # Whether any Parse went out (a connection's first use of a statement); else every
        # result is a statement's own.
        self._parsing = parsing

    def wait(self) -> int:
        """The (last) statement's row count; a database error is raised as Django's."""
        return self.wait_all()[-1]

    def wait_all(self) -> list[int]:
        """Each statement's row count; the first database error is raised as Django's (and then
        none of them took effect: they ran in one transaction)."""
        with self._connection.wrap_database_errors:
            try:
                results, failed = _read(self._pgconn)
            except BaseException:
                # Answers still unread: the connection cannot take another statement.
                self._connection.close()
                raise
            answers = self._note_prepared(results) if self._parsing else results
            if failed is not None and self._preparing is not None:
                state = _sqlstate(failed)
                if state == _UNKNOWN_PREPARED:
                    # Nothing ran (the implicit transaction ended at the error): send it unprepared.
                    _switch_to_unprepared(self._connection.alias)
                    return send_all(self._connection, self._statements).wait_all()
                if state == _DUPLICATE_PREPARED:
                    # The session had the name already (a pooler's server connection that another
                    # client prepared it on): known now, so sent again without the Parse.
                    return send_all(self._connection, self._statements).wait_all()
            if failed is not None:
                _raise(failed)
            # The first answer is set_config's.
            return [int(result.command_tuples or 0) for result in answers[1:]]

    def _note_prepared(self, results: list[Any]) -> list[Any]:
        """Remember the names whose Parse succeeded (a prepared statement outlives a failed
        transaction, and one already there answers 42P05); return the statements' own results."""
        known = _prepared.setdefault(self._connection.connection, set())
        answers = []
        for name, result in zip(self._preparing or (), results, strict=True):
            if name is None:
                answers.append(result)
            elif result.status == _pq().ExecStatus.COMMAND_OK or _sqlstate(result) == _DUPLICATE_PREPARED:
                known.add(name)
        return answers


def send(connection: BaseDatabaseWrapper, sql: bytes, params: Sequence[bytes | None]) -> Pending:
    """Send ``sql`` ($1-style placeholders, text parameters) with an async commit; the caller
    checked ``available``. Returns before PostgreSQL answers."""
    return send_all(connection, [(sql, params)])


def send_all(connection: BaseDatabaseWrapper, statements: Sequence[Statement]) -> Pending:
    """Send the statements in one transaction with an async commit, as ``send`` does one."""
    connection.ensure_connection()
    with connection.wrap_database_errors:
        pgconn = connection.connection.pgconn
        if pgconn.pipeline_status or pgconn.transaction_status:
            # Closed or broken under Django's feet (a job closed the socket), or inside a
            # transaction Django does not know of: the caller's retry replaces the connection.
            from psycopg import OperationalError

            raise OperationalError("the connection is closed, broken or inside a transaction")
        # The setting goes first, as one more statement: prepared like the others (parsing and
        # planning it on every call delayed the answer ~15 us).
        sent: list[Statement] = [(_ASYNC_COMMIT, ()), *statements]
        preparing: list[bytes | None] | None = [] if connection.alias not in _unprepared else None
        known = _prepared.get(connection.connection) or set()
        parsing: set[bytes] = set()  # a writer's batch repeats its SQL: one Parse a name
        pgconn.enter_pipeline_mode()
        try:
            for sql, params in sent:
                if preparing is None:
                    pgconn.send_query_params(sql, params)
                    continue
                name = _name_of(sql)
                if name not in known and name not in parsing:
                    # A statement's first use on this connection prepares it in the same
                    # pipeline, not in a round trip of its own first: with Django's default
                    # CONN_MAX_AGE a request's connection is new, and its first dispatch would
                    # wait for two more answers.
                    pgconn.send_prepare(name, sql)
                    parsing.add(name)
                    preparing.append(name)
                pgconn.send_query_prepared(name, params)
                preparing.append(None)
            pgconn.pipeline_sync()
            while pgconn.flush():  # non-blocking libpq: 1 while output is left
                select.select([], [pgconn.socket], [])
        except BaseException:
            connection.close()
            raise
    return Pending(connection, pgconn, statements, preparing, parsing=bool(parsing))


def execute(connection: BaseDatabaseWrapper, sql: bytes, params: Sequence[bytes | None]) -> int:
    """``send`` and wait: the statement's row count."""
    return send(connection, sql, params).wait()


def _switch_to_unprepared(alias: str) -> None:
    with _unprepared_lock:
        if alias in _unprepared:
            return  # another thread's statement found out first, and said so
        _unprepared.add(alias)
    # Once per alias and process: an operator behind a pooler learns why, and what keeps them.
    logger.warning(
        "kumiko_jobs: a prepared statement went missing on database %r (a pooler such as "
        "PgBouncer in transaction mode hands the session to another server connection); this "
        "process sends its run writes there unprepared from now on. PgBouncer 1.21 or later "
        "with max_prepared_statements keeps them.",
        alias,
    )


@lru_cache(maxsize=256)
def _name_of(sql: bytes) -> bytes:
    """A statement's prepared name: its SQL's hash (the hot path sends the same few texts)."""
    return b"kumiko_" + hashlib.blake2b(sql, digest_size=8).hexdigest().encode()


def _read(pgconn: Any) -> tuple[list[Any], Any]:
    """Every result up to the pipeline's Sync, and out of pipeline mode again; with the first
    failed one (None if none failed)."""
    sync, fatal_error = _statuses()
    results = []
    failed = None
    # A dispatch reads this answer after Redis': it is nearly always here by then, so it is
    # read at once, without a select() first (libpq's socket never blocks: with nothing to read
    # this returns, and the loop below waits).
    pgconn.consume_input()
    while True:
        while pgconn.is_busy():
            select.select([pgconn.socket], [], [])
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:  # the end of one statement's results in pipeline mode
            continue
        status = result.status
        if status == sync:
            break
        if status == fatal_error and failed is None:
            failed = result
        results.append(result)
    pgconn.exit_pipeline_mode()
    return results, failed


@cache
def _pq() -> Any:
    """psycopg's libpq module, imported once it is needed (psycopg2 projects never import it)."""
    from psycopg import pq

    return pq


@cache
def _statuses() -> tuple[int, int]:
    """PIPELINE_SYNC and FATAL_ERROR as plain ints: the read loop compares every result's."""
    status = _pq().ExecStatus
    return int(status.PIPELINE_SYNC), int(status.FATAL_ERROR)


def _sqlstate(result: Any) -> bytes:
    return bytes(result.error_field(_pq().DiagnosticField.SQLSTATE) or b"")


def _raise(result: Any) -> None:
    """Raise a failed result as psycopg would (Django's error, from wrap_database_errors)."""
    from psycopg import errors

    sqlstate = _sqlstate(result).decode()
    message = result.error_message.decode(errors="replace").strip()
    raise errors.lookup(sqlstate)(message) if sqlstate else errors.DatabaseError(message)


def text(value: Any) -> bytes | None:
    """A parameter's PostgreSQL text input, by the value's type: None, bool, str (and its
    subclasses, such as TextChoices), int, float, UUID, datetime. Anything else is a TypeError,
    not a guess."""
    convert = _TEXT.get(type(value))
    if convert is not None:
        return convert(value)
    if isinstance(value, str):
        return _text_str(str.__str__(value))
    raise TypeError(f"no PostgreSQL text form for a parameter of type {type(value).__name__}")


def _text_bool(value: bool) -> bytes:
    return b"t" if value else b"f"


def _text_none(value: None) -> None:
    return None


def _text_str(value: str) -> bytes:
    # libpq reads a text parameter up to its first NUL, and PostgreSQL's text cannot hold one:
    # replaced, so an error message with a stray NUL is stored whole (a cursor would refuse the
    # write, and the outcome would be lost).
    return value.encode() if "\x00" not in value else value.replace("\x00", "\ufffd").encode()


def _text_number(value: float) -> bytes:
    return str(value).encode()


def _text_uuid(value: uuid.UUID) -> bytes:
    return value.hex.encode()


def _text_datetime(value: datetime) -> bytes:
    # ISO 8601 with its offset (naive only with USE_TZ off: the session's time zone applies, as
    # for the ORM's parameters).
    return value.isoformat().encode()


Converter = Callable[[Any], bytes | None]

_TEXT: dict[type, Converter] = {
    bool: _text_bool,
    type(None): _text_none,
    str: _text_str,
    int: _text_number,
    float: _text_number,
    uuid.UUID: _text_uuid,
    datetime: _text_datetime,
}


def json_text(encoder: type[json.JSONEncoder] | None) -> Converter:
    """A JSON column's text input, encoded as Django's JSONField encodes it (None: SQL NULL)."""

    def convert(value: Any) -> bytes | None:
        return None if value is None else json.dumps(value, cls=encoder).encode()

    return convert
