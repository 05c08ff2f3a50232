"""The per-process tally of ended attempts and its batched flush through finish_and_claim."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from kumiko_jobs import dispatch, lane_stats
from kumiko_jobs.connection import get_keys
from kumiko_jobs.outcome_counts import FLUSH_INTERVAL, OutcomeTally
from kumiko_jobs.testing import drain


def test_the_tally_batches_until_a_flush_is_due() -> None:
    tally = OutcomeTally()
    now = time.time()
    hour = int(now // 3600)
    for _ in range(3):
        tally.add("worker", "succeeded", "a.job", "1", now)
    tally.add("worker", "requeued", "a.job", "1", now)  # not an attempt: not counted
    tally.add("api", "failed", "b.job", None, now)
    assert tally.take("worker") == [hour, "succeeded", 3, "a.job", "1"]  # the first take is due
    tally.add("worker", "failed", "a.job", "1", now)
    assert tally.take("worker") == []  # within FLUSH_INTERVAL of the last
    assert tally.take("worker", force=True) == [hour, "failed", 1, "a.job", "1"]
    assert tally.take("api") == [hour, "failed", 1, "b.job", ""]
    tally.give_back("api", [hour, "failed", 1, "b.job", ""])
    assert tally.take("api", force=True) == [hour, "failed", 1, "b.job", ""]
    assert FLUSH_INTERVAL <= 1.0


@pytest.mark.django_db(transaction=True)
def test_drained_runs_are_counted_at_once(tenants: list[Any], redis_client: redis.Redis) -> None:
    for _ in range(4):
        dispatch("tests.record", {"n": 1}, tenant=tenants[0])
    drain()
    hour = lane_stats.hourly(redis_client, get_keys(), "worker")[-1]
    assert hour.get("succeeded") == 4


def test_a_step_that_fails_takes_back_its_counts() -> None:
    """The claimer sends a failed step's attempts again (Redis down for a while): each was
    counted once more per failed call, ten extra copies for a 30-second outage."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from kumiko_jobs.lane import Finished, step
    from kumiko_jobs.outcome_counts import tally
    from kumiko_jobs.outcomes import Outcome

    dead = redis.Redis(port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    ended = Finished(
        "some-job", "some-job:x", Outcome("ok", "succeeded", job_name="tests.record", tenant_id="7")
    )
    tally.take("worker", force=True)  # whatever other tests left
    for _ in range(2):
        with pytest.raises(redis.ConnectionError):
            step(dead, get_keys(), "worker", [ended], [])
    assert tally.take("worker", force=True) == []
