"""Script calls on the hot paths, packed in one pass.

Every dispatch and every executed job is one EVALSHA of 20-40 arguments. redis-py's generic
packer spends ~30 us on such a call (an encoder call, type checks and a memoryview test per
argument); the arguments here are only str, bytes, int and float, which hiredis' C packer
writes in one call (the same bytes; measured here on a step's 28 arguments: 13 us against 43 us
for the Python loop it replaced). The reply is read by redis-py's own parser on a connection of
the client's pool, so connection handling, TLS and RESP3 stay redis-py's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import hiredis
import redis
from redis.commands.core import Script


def pack(*args: str | bytes | int | float) -> bytes:
    """One command in RESP (what redis-py's pack_command writes for these types)."""
    # Exact types (a bool is an int, and Redis would get "True"): anything else is a bug.
    # hiredis refuses bools too, but not other int or str subclasses.
    if not set(map(type, args)) <= _PACKABLE:
        bad = next(arg for arg in args if type(arg) not in _PACKABLE)
        raise TypeError(f"script argument of type {type(bad).__name__}: {bad!r}")
    # hiredis' stub types the argument as a tuple of one item.
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]
    return packed


_PACKABLE = frozenset({str, bytes, int, float})


def send(connection: Any, script: Script, keys: Sequence[str], args: Sequence[Any]) -> None:
    """Send one EVALSHA on ``connection`` (the reply is read with ``connection.read_response``)."""
    connection.send_packed_command([pack("EVALSHA", script.sha, len(keys), *keys, *args)], check_health=False)


def call(
    client: redis.Redis,
    script: Script,
    keys: Sequence[str],
    args: Sequence[Any],
    *,
    connection: Any = None,
    args_again: Callable[[], Sequence[Any]] | None = None,
) -> Any:
    """Run ``script`` and return its reply. A script Redis does not know yet (first use, a
    restarted server) and a connection that failed are handed to redis-py's own call, which
    loads the script and applies the client's retry policy. After a failure that leaves open
    whether the call ran (a timeout, or a connection lost once it was sent), that call gets the
    arguments ``args_again()`` makes, when given: the script's way of not doing twice what the
    first call may have done (lua/finish_and_claim.lua). A callable: on the hot path they are
    almost never needed.

    ``connection``: one of the client's connections that only this caller uses (the --threads
    lane steps, lane.Stepper). Taking one from the pool per call costs a lock, a select()
    on its socket and redis-py's connection-count metrics: tens of microseconds, and with
    --threads N every system call is a chance for another thread to take the GIL."""
    if connection is not None:
        reply = _call_on(connection, script, keys, args)
    else:
        pool = client.connection_pool
        try:
            taken = pool.get_connection()
        except (redis.ConnectionError, redis.TimeoutError):
            return script(keys=list(keys), args=list(args), client=client)
        try:
            reply = _call_on(taken, script, keys, args)
        finally:
            pool.release(taken)
    if reply is _HAND_OVER:
        return script(keys=list(keys), args=list(args), client=client)
    if reply is _UNKNOWN:
        again = args_again() if args_again is not None else args
        return script(keys=list(keys), args=list(again), client=client)
    return reply


_HAND_OVER = object()  # _call_on: nothing ran; let redis-py's own script call do it
_UNKNOWN = object()  # _call_on: it may have run; the same, with args_again


def _call_on(connection: Any, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
    try:
        send(connection, script, keys, args)
        return connection.read_response()
    except redis.exceptions.NoScriptError:
        return _HAND_OVER
    except redis.ResponseError:
        raise  # the script's own error: the connection read all of it and stays usable
    except (redis.ConnectionError, redis.TimeoutError):
        # The reply may still be in flight: never send on this socket again (a dedicated
        # connection reconnects on its next send).
        connection.disconnect()
        return _UNKNOWN
    except BaseException:
        connection.disconnect()
        raise
