"""Shared fixtures: every test gets its own Redis key prefix on the real Redis."""

from __future__ import annotations

import fcntl
import json
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.testing import forget_prefix


@pytest.fixture(autouse=True)
def kumiko_prefix(settings: Any) -> Iterator[str]:
    """A fresh QUEUE_PREFIX per test; its Redis keys and its names in RQ's global sets are
    deleted afterwards (testing.forget_prefix)."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "QUEUE_PREFIX": prefix}
    client = get_redis()  # the real one: a test may point the settings at a dead Redis
    yield prefix
    forget_prefix(client, prefix)


@pytest.fixture
def redis_client() -> redis.Redis:
    return get_redis()


# CLIENT PAUSE holds every client of the server, and any UNPAUSE ends every pause: the tests
# that pause take turns through this file's lock (the suite runs in several processes, and
# clean clones beside it share the Redis), so one test's UNPAUSE cannot end another's pause.
_PAUSE_LOCK = Path(tempfile.gettempdir()) / "kumiko-tests-redis-pause.lock"


@pytest.fixture
def redis_writes_paused(redis_client: redis.Redis) -> Callable[[int], AbstractContextManager[None]]:
    """``with redis_writes_paused(ms):`` Redis refuses to answer writes for up to ``ms``
    milliseconds, or until the block ends."""

    @contextmanager
    def paused(milliseconds: int) -> Iterator[None]:
        with _PAUSE_LOCK.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            redis_client.execute_command("CLIENT", "PAUSE", milliseconds, "WRITE")
            try:
                yield
            finally:
                redis_client.execute_command("CLIENT", "UNPAUSE")

    return paused


@pytest.fixture
def age_suspects(redis_client: redis.Redis, kumiko_prefix: str) -> Any:
    """As if CONFIRM_AFTER had passed: every run noted as missing from Redis (suspects.py) is
    due for its confirmation; returns how many there are."""

    def age() -> int:
        aged = 0
        for key in redis_client.scan_iter(match=f"{kumiko_prefix}:*:suspects:*"):
            members = redis_client.zrange(key, 0, -1)
            redis_client.zadd(key, dict.fromkeys(members, 0), xx=True)
            aged += len(members)
        return aged

    return age


@pytest.fixture
def traces(redis_client: redis.Redis) -> Any:
    """Read what test jobs recorded (tests/testapp/jobs.py: trace())."""

    def read(kind: str | None = None) -> list[dict[str, Any]]:
        raw = redis_client.lrange(f"{get_keys().prefix}:trace", 0, -1)
        entries = [json.loads(item) for item in raw]
        return [e for e in entries if kind is None or e["kind"] == kind]

    return read


@pytest.fixture
def tenants(db: None) -> list[Any]:
    """The demo tenants (transactional tests flush the seed data, so create them again)."""
    from project.demo.models import Tenant

    return [
        Tenant.objects.get_or_create(slug=slug, defaults={"name": name})[0]
        for name, slug in (("Acme Corp", "acme"), ("Globex", "globex"), ("Initech", "initech"))
    ]


def tenant_of_staff(user: Any) -> int | None:
    """USER_TENANT hook of the admin tests: user "staff-<slug>" belongs to the tenant <slug>."""
    from project.demo.models import Tenant

    slug = user.username.removeprefix("staff-")
    return Tenant.objects.filter(slug=slug).values_list("pk", flat=True).first()


@pytest.fixture
def staff_client(settings: Any, django_user_model: Any) -> Any:
    """A client factory for non-superuser staff with the view permissions of the run browser and
    the tenant failure list; their tenant comes from their name (tenant_of_staff)."""
    from django.contrib.auth.models import Permission
    from django.test import Client

    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "USER_TENANT": "tests.conftest.tenant_of_staff"}

    def login(username: str) -> Client:
        user = django_user_model.objects.create_user(username=username, is_staff=True)
        user.user_permissions.add(
            *Permission.objects.filter(codename__in=["view_jobrun", "view_tenantfailure"])
        )
        client = Client()
        client.force_login(user)
        return client

    return login


@pytest.fixture(autouse=True)
def run_rows_keep_the_rules(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test with the database: the run rows it leaves keep the run table's rules
    (tests/run_invariants.py). Requesting pytest-django's database fixture here orders the
    check after the test's other fixtures (its workers stopped) and before the rollback or
    flush."""
    if (
        request.node.get_closest_marker("django_db") is None
        and "_django_db_helper" not in request.fixturenames
    ):
        yield
        return
    request.getfixturevalue("_django_db_helper")
    yield
    from django.db import DatabaseError

    from tests.run_invariants import runs_breaking_the_rules

    try:
        broken = runs_breaking_the_rules()
    except DatabaseError:
        return  # the test left its connection unusable: its own failure says why
    assert not broken, f"run rows break the run table's rules: {broken}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The chaos suite's figures (tests/integration/chaos.py), one line per scenario: kept with
    each test's report, so they are printed under pytest-xdist too, and also when the test failed."""
    lines = [
        f"{report.nodeid.rpartition('::')[2]}: {value}"
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        if report.when == "call"
        for name, value in report.user_properties
        if name == "chaos"
    ]
    if lines:
        terminalreporter.section("chaos figures")
        for line in lines:
            terminalreporter.line(line)


def tenant_of_staff_spelled_long(user: Any) -> str | None:
    """tenant_of_staff, with the key spelled another way ("007" for 7): the same tenant."""
    pk = tenant_of_staff(user)
    return None if pk is None else f"00{pk}"
