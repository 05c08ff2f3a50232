"""Helpers for users' tests: run pending jobs in-process, with real Redis and the real database."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from django.conf import settings

from kumiko_jobs.async_handlers import close_thread_loop
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.definitions import LANES
from kumiko_jobs.execution import run_claimed
from kumiko_jobs.keys import RQ_WORKERS, Keys
from kumiko_jobs.lane import Claim, Finished, count_claims, finish_and_claim, promote_due
from kumiko_jobs.outcomes import given_back
from kumiko_jobs.pushing import unregister_queues

DRAIN_WORKER = "kumiko-drain"
logger = logging.getLogger("kumiko_jobs")


class DrainTimeout(AssertionError):
    """drain() still had jobs ready to run at its ``limit``: more work than the limit allows, or
    a job that dispatches itself without end. An AssertionError: in a test, a failure."""


class Drained(dict[str, int]):
    """drain()'s counts by outcome (a plain dict to compare), and ``waiting``: the runs still
    scheduled when it returned (retries, deferrals or delayed dispatches due after its timeout),
    which it did not run."""

    waiting: int = 0


# drain()'s default limit on running ready jobs, at least: a short ``timeout`` (how long to wait
# for delayed runs) must not cut off ready work on a loaded machine.
RUN_LIMIT = 10.0


def drain(timeout: float = 10.0, lanes: tuple[str, ...] = LANES, *, limit: float | None = None) -> Drained:
    """Run every queued job of both lanes, and delayed ones (retries, deferrals) that fall due
    within ``timeout`` seconds, in this process. Returns counts by outcome, e.g.
    ``{"succeeded": 3, "retried": 1, "failed": 1}``; its ``waiting`` counts the runs left
    scheduled past the timeout (also logged as a warning). Jobs still ready to run after
    ``limit`` seconds (default: ``timeout``, at least RUN_LIMIT) raise ``DrainTimeout``: a job
    that dispatches itself again and again fails the test instead of hanging it.

    Jobs dispatched inside a test's transaction reach Redis on commit: use a
    ``transactional_db`` test, or pytest-django's ``django_capture_on_commit_callbacks(execute=True)``.
    Inside a transaction the jobs run in it (their records too), and the worker's clean-up after
    a job leaves it open.
    """
    client, keys = get_redis(), get_keys()
    counts: Counter[str] = Counter()
    started = time.monotonic()
    deadline = started + timeout
    run_deadline = started + (max(timeout, RUN_LIMIT) if limit is None else limit)
    try:
        while True:
            ran = False
            next_due: float | None = None
            for lane in lanes:
                due = promote_due(client, keys, lane)
                if due is not None:
                    next_due = due if next_due is None else min(next_due, due)
                claim = Claim(DRAIN_WORKER, "drain", time.time() + 3600)
                while job := finish_and_claim(client, keys, lane, claim=claim):
                    count_claims(client, keys, lane, 1)
                    member = f"{job.job_id}:drain"
                    if time.monotonic() > run_deadline:
                        # Back to the front of its flow, unstarted, as a stopping worker gives
                        # back its ready jobs: the test fails, and the run is not lost.
                        finish_and_claim(
                            client,
                            keys,
                            lane,
                            Finished(job.job_id, member, given_back(job.job_id, job.meta_raw)),
                        )
                        raise DrainTimeout(
                            f"drain() still had jobs to run after its limit of {run_deadline - started:g}s "
                            f"(it ran {dict(counts) or 'none'}; next: {job.job_id} on lane {lane!r}): "
                            "a job that dispatches itself without end, or more work than the "
                            "limit allows (pass a larger limit=)"
                        )
                    outcome = run_claimed(job, worker=DRAIN_WORKER, consumer_lane=lane)
                    finish_and_claim(client, keys, lane, Finished(job.job_id, member, outcome))
                    counts[outcome.counted_as] += 1
                    ran = True
            if ran:
                continue
            if next_due is None:
                break
            wait = next_due - time.time()
            if time.monotonic() + max(wait, 0) > deadline:
                break
            time.sleep(max(wait, 0.005))
    finally:
        # Async handlers' database thread keeps a connection: give it back, as a stopping worker does.
        close_thread_loop()
    drained = Drained(counts)
    drained.waiting = sum(int(client.zcard(keys.scheduled(lane))) for lane in lanes)
    if drained.waiting:
        logger.warning(
            "kumiko_jobs: drain() returned with %d run(s) still scheduled after its timeout of %gs "
            "(retries, deferrals or delayed dispatches due later); they did not run",
            drained.waiting,
            timeout,
        )
    return drained


@contextmanager
def isolated_prefix(prefix: str | None = None) -> Iterator[str]:
    """Use a fresh ``QUEUE_PREFIX`` (queues, locks, counters) and delete its keys afterwards."""
    from django.test import override_settings

    prefix = prefix or f"test-{uuid.uuid4().hex[:12]}"
    client = get_redis()
    with override_settings(KUMIKO_JOBS={**getattr(settings, "KUMIKO_JOBS", {}), "QUEUE_PREFIX": prefix}):
        try:
            yield prefix
        finally:
            forget_prefix(client, prefix)


def forget_prefix(client: redis.Redis, prefix: str) -> None:
    """Delete every key of ``prefix``, and its names in RQ's global sets: the lanes' queues a
    dispatch listed in ``rq:queues`` and workers that never unregistered (killed ones) in
    ``rq:workers``. Without the second step each test would leave its queues behind, and
    django-rq's dashboard on a shared Redis would list them all."""
    names = Keys(prefix)
    own, tag = _glob_escape(prefix), _glob_escape(names.id_tag)
    # The key shapes this prefix makes, not every key that contains it: "shop" must not take
    # "myshop:..." or "rq:queue:shop2:worker" with it. Its own keys; RQ's queues and registries
    # of its lanes ("rq:wip:<prefix>:<lane>"); job hashes, results and workers named by the id
    # tag, which differs from a prefix with characters RQ's ids do not allow ("test-1" tags its
    # jobs "test_1_<hash>-...").
    for pattern in (f"{own}:*", f"rq:*:{own}:*", f"rq:*:{tag}-*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    unregister_queues(client, [names.queue(lane) for lane in LANES])
    # Workers are named "<id tag>-<lane>-...", or after the prefix by hand.
    workers = [
        worker
        for name in {tag, own}
        for worker in client.sscan_iter(RQ_WORKERS, match=Keys.worker(f"{name}-*"), count=1000)
    ]
    if workers:
        client.srem(RQ_WORKERS, *workers)


def _glob_escape(text: str) -> str:
    """``text`` matched literally by Redis' glob patterns (a prefix "a*" must not match "ab")."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
