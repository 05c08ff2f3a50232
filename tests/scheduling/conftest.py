"""In-process scheduling tests: the real planner, lease, Redis and database, driven by an
injected clock (no sleeping through hours), with jobs declared in an isolated registry."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from kumiko_jobs.connection import get_keys
from kumiko_jobs.definitions import JobDefinition
from kumiko_jobs.registry import build_definition, registry
from kumiko_jobs.scheduling.lease import LeaderLease
from kumiko_jobs.scheduling.planner import Planner
from kumiko_jobs.scheduling.specs import lane_schedules
from tests.testapp.jobs import _ctx_fields, trace


def record_tick(payload: dict[str, Any], ctx: Any) -> None:
    trace("tick", **_ctx_fields(ctx))


def utc(*parts: int) -> float:
    return datetime(*parts, tzinfo=UTC).timestamp()  # type: ignore[arg-type]


class FakeClock:
    def __init__(self, start: float) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


@dataclass
class Leader:
    planner: Planner
    token: str
    clock: FakeClock
    lease: LeaderLease

    def run_until(self, until: float, step: float = 60.0) -> None:
        """Advance the clock to ``until`` in steps, letting the leader fire what falls due."""
        while self.clock.t < until:
            self.clock.t = min(until, self.clock.t + step)
            assert self.planner.step(self.token) is not None, "lost the lease"


@pytest.fixture
def declare() -> Iterator[Callable[..., JobDefinition]]:
    """``declare(name, **job options)`` registers a tick-recording job for this test only."""
    with registry.isolated():

        def add(name: str, **options: Any) -> JobDefinition:
            registry.register(build_definition(record_tick, name, options))
            return registry.get(name)

        yield add


@pytest.fixture
def make_leader(redis_client: redis.Redis) -> Callable[..., Leader]:
    """``make_leader(start, lane="worker", owner="a")``: take the lane's lease and load a planner."""

    def make(start: float, lane: str = "worker", owner: str = "a") -> Leader:
        clock = FakeClock(start)
        lease = LeaderLease(redis_client, get_keys(), lane, owner)
        token = lease.acquire()
        assert token is not None, f"lease of {lane} is held by {lease.holder()}"
        planner = Planner(
            lane_schedules(lane), lease=lease, client=redis_client, keys=get_keys(), clock=clock
        )
        assert planner.load(token)
        return Leader(planner, token, clock, lease)

    return make
