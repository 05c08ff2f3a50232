"""``manage.py jobs <subcommand>`` when Redis does not answer or refuses: one line naming the
subcommand, Redis (never its password) and what to do, instead of a traceback."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError

from kumiko_jobs import cron
from kumiko_jobs.registry import build_definition, registry

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "hunter2"
# Every subcommand that reads or writes Redis (prune touches only the database).
SUBCOMMANDS = [
    ("stats",),
    ("stats", "--json"),
    ("list", "--json"),
    ("trigger", "t.record"),
    ("rebuild", "--dry-run"),
    ("rebuild",),
]


def noop(payload: dict[str, Any], ctx: Any) -> None:
    pass


@pytest.fixture(autouse=True)
def jobs() -> Iterator[None]:
    """A job to trigger, and a tz="tenant" cron: `jobs list` reads its zones from Redis."""
    with registry.isolated():
        registry.register(build_definition(noop, "t.record", {}))
        registry.register(
            build_definition(
                noop, "t.local", {"trigger": cron("30 6 * * *", tz="tenant"), "per_tenant": True}
            )
        )
        yield


@pytest.fixture
def refusing_user(redis_client: redis.Redis) -> Iterator[str]:
    """A user of the real Redis that may connect and nothing else (removed afterwards)."""
    name = f"kj-test-{uuid.uuid4().hex[:10]}"
    redis_client.acl_setuser(
        name, enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], commands=["+@connection"]
    )
    try:
        yield name
    finally:
        redis_client.acl_deluser(name)


def use_redis(settings: Any, url: str) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "REDIS": None, "REDIS_URL": url, "REDIS_TIMEOUT": 0.5}


def failure_of(*args: str) -> str:
    with pytest.raises(CommandError) as raised:
        call_command("jobs", *args, stdout=StringIO())
    message = str(raised.value)
    assert message.startswith(f"jobs {args[0]}: Redis at redis://")
    assert PASSWORD not in message
    assert "\n" not in message
    return message


@pytest.mark.parametrize("args", SUBCOMMANDS, ids=" ".join)
def test_a_redis_that_does_not_answer(settings: Any, args: tuple[str, ...]) -> None:
    use_redis(settings, f"redis://:{PASSWORD}@127.0.0.1:1/0")  # nothing listens on port 1

    message = failure_of(*args)

    assert "Redis at redis://:***@127.0.0.1:1/0 did not answer" in message
    assert "Check that Redis runs" in message


@pytest.mark.parametrize("args", SUBCOMMANDS, ids=" ".join)
def test_a_redis_that_refuses_the_commands(settings: Any, refusing_user: str, args: tuple[str, ...]) -> None:
    use_redis(settings, f"redis://{refusing_user}:{PASSWORD}@127.0.0.1:6379/0")

    message = failure_of(*args)

    assert f"Redis at redis://{refusing_user}:***@127.0.0.1:6379/0 refused" in message
    assert "no permissions to run the" in message
    assert "allow" in message  # what to do about it: a hint for every subcommand, trigger's too


@pytest.mark.parametrize("args", SUBCOMMANDS, ids=" ".join)
def test_a_redis_that_refuses_the_credentials(settings: Any, args: tuple[str, ...]) -> None:
    use_redis(settings, f"redis://kj-nobody:{PASSWORD}@127.0.0.1:6379/0")

    message = failure_of(*args)

    assert "Redis at redis://kj-nobody:***@127.0.0.1:6379/0 refused the credentials" in message
    assert "Check the user and password of KUMIKO_JOBS['REDIS'] (or env KUMIKO_REDIS_URL)" in message


def test_another_error_reply_is_reported_as_it_is_without_a_permissions_hint(
    redis_client: redis.Redis,
) -> None:
    from kumiko_jobs.connection import get_keys

    redis_client.set(get_keys().scheduled("worker"), "not a sorted set")  # ZCARD answers WRONGTYPE

    with pytest.raises(CommandError) as raised:
        call_command("jobs", "stats", stdout=StringIO())

    message = str(raised.value)
    assert message.startswith("jobs stats: Redis at redis://") and "answered with an error (" in message
    assert "WRONGTYPE" in message
    assert "allowed" not in message and "primary" not in message
