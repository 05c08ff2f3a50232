"""Filling queues before a worker starts: kumiko's lanes and RQ's lists.

- ``fill_lane``: ``dispatch()`` per run inside one transaction (rows now, pushes on commit), the
  way an application queues a batch; ~1 ms a run.
- ``fill``: the fast way for backlogs of 10,000-100,000 runs, as tests/test_gates.py does:
  ``prepare()`` + ``push()`` in pipelined batches of 500, rows through ``records.insert_queued``
  first (as ``dispatch()`` inside a transaction does), split over one forked process per core,
  since that is Python-bound (~0.16 ms a run, ~0.25 ms with its row).
- ``fill_rq_queue``: RQ's ``enqueue_many`` in pipelined batches (JSON serializer).

Every run carries the correlation id ``<prefix>_<tag>``, which bench/timing.py reads back.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from bench.environment import BenchEnv, BenchError
from bench.rqtasks import noop

PUSH_BATCH = 500
ENQUEUE_BATCH = 500
MAX_FILL_PROCESSES = 4


def fill_lane(env: BenchEnv, count: int, tag: str, job: str = "bench.noop", **payload: Any) -> list[str]:
    """Queue ``count`` ``job`` runs of the bench tenant through dispatch() (payload
    ``{"i": i, **payload}``): rows in one transaction, pushes on commit."""
    from django.db import transaction

    from kumiko_jobs import dispatch

    job_ids: list[str] = []
    with transaction.atomic():
        for i in range(count):
            result = dispatch(
                job, {"i": i, **payload}, tenant=env.tenant_id, correlation_id=f"{env.prefix}_{tag}"
            )
            job_ids.append(str(result.job_id))
    return job_ids


def push_runs(prefix: str, name: str, tenants: Iterable[str], *, tag: str, rows: bool = True) -> list[str]:
    """Queue one run of job ``name`` per item of ``tenants``: prepare() and push() in pipelined
    batches, rows inserted first (as dispatch() inside a transaction does)."""
    from kumiko_jobs import records
    from kumiko_jobs.preparing import prepare
    from kumiko_jobs.pushing import push
    from kumiko_jobs.registry import registry

    definition = registry.get(name)
    correlation_id = f"{prefix}_{tag}"
    job_ids: list[str] = []
    numbered = enumerate(tenants)
    while batch := list(islice(numbered, PUSH_BATCH)):
        prepared = [
            prepare(definition, {"n": n}, tenant_id=tenant, user_id=None, correlation_id=correlation_id)
            for n, tenant in batch
        ]
        if rows:
            records.insert_queued([p.row for p in prepared])
        refused = [o for o in push(prepared) if o.status != "queued"]
        if refused:
            raise BenchError(f"{len(refused)} backlog runs were not queued, e.g. {refused[0]}")
        job_ids += [p.job_id for p in prepared]
    return job_ids


def fill(prefix: str, name: str, tenants: Sequence[str], *, tag: str, rows: bool = True) -> list[str]:
    """push_runs() split over one forked process per core (at most 4). Runs of one tenant land
    in its flow in the order the processes push them."""
    from django.db import connections

    processes = min(os.cpu_count() or 1, MAX_FILL_PROCESSES)
    if processes < 2 or len(tenants) < 4 * PUSH_BATCH:
        return push_runs(prefix, name, tenants, tag=tag, rows=rows)
    connections.close_all()  # the children must not share this process's database connection
    shares = [tenants[i::processes] for i in range(processes)]
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        pushed = pool.map(functools.partial(_push_share, prefix, name, tag, rows), shares)
    connections["default"].ensure_connection()  # not in the first measured dispatch()
    return [job_id for share in pushed for job_id in share]


def _push_share(prefix: str, name: str, tag: str, rows: bool, tenants: Sequence[str]) -> list[str]:
    from django.db import connections

    try:
        return push_runs(prefix, name, tenants, tag=tag, rows=rows)
    finally:
        connections.close_all()  # before the pool ends this process


def fill_rq_queue(
    client: redis.Redis, queue_name: str, count: int, func: Callable[..., None] = noop, *args: Any
) -> list[str]:
    """Queue ``count`` raw jobs ``func(*args, i)`` with enqueue_many (fast, so filling does not
    dominate the run); ids ``<queue_name>_<i>``."""
    queue = Queue(queue_name, connection=client, serializer=JSONSerializer)
    job_ids = [f"{queue_name}_{i}" for i in range(count)]
    for start in range(0, count, ENQUEUE_BATCH):
        batch = job_ids[start : start + ENQUEUE_BATCH]
        with client.pipeline() as pipe:
            queue.enqueue_many(
                [
                    Queue.prepare_data(func, (*args, start + n), job_id=job_id)
                    for n, job_id in enumerate(batch)
                ],
                pipeline=pipe,
            )
            pipe.execute()
    return job_ids
