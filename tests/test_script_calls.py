"""Script calls packed by script_calls.py: the bytes redis-py would send, and its fallbacks."""

from __future__ import annotations

import pytest
import redis
from redis.connection import Connection

from kumiko_jobs import script_calls
from kumiko_jobs.connection import get_keys


@pytest.mark.parametrize(
    "args",
    [
        ("EVALSHA", "a" * 40, 2, "k1", "k2"),
        ("x", b"\x00\xff raw", 0, -7, 2**40, 0.0, 1.5, 1e-7, 1764599999.123456, 1 / 3),
        ("ünïcødé", "", b"", "line\r\nbreak"),
    ],
)
def test_packed_commands_are_the_bytes_redis_py_sends(args: tuple[object, ...]) -> None:
    assert script_calls.pack(*args) == b"".join(Connection().pack_command(*args))  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [True, None, ["list"], 3j])
def test_an_argument_of_another_type_is_refused_not_guessed(bad: object) -> None:
    with pytest.raises(TypeError, match="script argument of type"):
        script_calls.pack("x", bad)  # type: ignore[arg-type]


def test_a_script_redis_does_not_know_is_loaded_and_run(redis_client: redis.Redis) -> None:
    key = f"{get_keys().prefix}:script-calls"
    script = redis_client.register_script("redis.call('SET', KEYS[1], ARGV[1]) return ARGV[2]")
    redis_client.script_flush()  # a restarted server: nothing loaded
    assert script_calls.call(redis_client, script, [key], ["stored", 42]) == b"42"
    assert redis_client.get(key) == b"stored"
    # Loaded now: the packed call itself answers, on a connection handed back to the pool.
    assert script_calls.call(redis_client, script, [key], ["again", 1.5]) == b"1.5"
    assert redis_client.get(key) == b"again"


def test_a_script_error_is_raised_and_the_connection_stays_usable(redis_client: redis.Redis) -> None:
    script = redis_client.register_script("return redis.error_reply('kumiko test: refused')")
    with pytest.raises(redis.ResponseError, match="kumiko test: refused"):
        script_calls.call(redis_client, script, [], [])
    assert redis_client.ping()


def test_a_dedicated_connection_bypasses_the_pool_and_survives_being_killed(
    redis_client: redis.Redis,
) -> None:
    script = redis_client.register_script("return ARGV[1]")
    pool = redis_client.connection_pool
    own = pool.get_connection()
    try:
        in_use = len(pool._in_use_connections)  # redis-py keeps no public count
        assert script_calls.call(redis_client, script, [], ["first"], connection=own) == b"first"
        assert len(pool._in_use_connections) == in_use  # nothing taken from the pool for it
        own.send_command("CLIENT", "ID")
        own_id = own.read_response()
        # The server drops the connection: this call falls back to redis-py's (through the pool),
        # and the dedicated connection reconnects on its next call.
        redis_client.client_kill_filter(_id=own_id)
        assert script_calls.call(redis_client, script, [], ["second"], connection=own) == b"second"
        assert script_calls.call(redis_client, script, [], ["third"], connection=own) == b"third"
        own.send_command("CLIENT", "ID")
        assert own.read_response() != own_id
    finally:
        pool.release(own)
