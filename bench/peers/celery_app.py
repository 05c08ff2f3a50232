"""Celery side of the peers section: the app on the Redis broker and the two tasks, no Django.

Worker: ``python -m celery -A bench.peers.celery_app worker --pool=threads --concurrency=8``
(started by bench/peer_rates.py with KUMIKO_QUEUE_PREFIX and KUMIKO_REDIS_URL set, plus
``-Q QUEUE`` and gossip, mingle and heartbeat off). Isolation: kombu's ``global_keyprefix``
puts the bench prefix in front of every key the transport writes (the queue list,
``_kombu.binding.*``, ``unacked*``), and the queue and exchange are named after the prefix too.
No result backend (results ignored: no ``celery-task-meta-*``), no remote control (no pidbox),
no events. Otherwise Celery's defaults (prefetch multiplier 4, ack on receipt, JSON).
"""

from __future__ import annotations

from celery import Celery  # type: ignore[import-untyped]

from bench.peers import stamps

PREFIX = stamps.bench_prefix()
QUEUE = f"{PREFIX}_celery"

app = Celery("bench_peers", broker=stamps.redis_url(), set_as_current=False)
app.conf.update(
    broker_transport_options={"global_keyprefix": f"{PREFIX}_kombu:"},
    broker_connection_retry_on_startup=True,
    task_default_queue=QUEUE,
    task_default_exchange=QUEUE,
    task_default_routing_key=QUEUE,
    task_ignore_result=True,
    result_backend=None,
    task_serializer="json",
    accept_content=["json"],
    worker_enable_remote_control=False,
    worker_send_task_events=False,
)


@app.task(name="bench.peers.trivial")  # type: ignore[untyped-decorator]
def trivial(key: str, expected: int, index: int) -> None:
    stamps.trivial(key, expected, index)


@app.task(name="bench.peers.io20")  # type: ignore[untyped-decorator]
def io20(key: str, expected: int, index: int) -> None:
    stamps.io20(key, expected, index)


TASKS = {"trivial": trivial, "io20": io20}
