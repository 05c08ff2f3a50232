"""Dramatiq side of the peers section: the Redis broker and the two actors, no Django.

Worker: ``python -m dramatiq bench.peers.dramatiq_tasks --processes 1 --threads 8`` (started by
bench/peer_rates.py with KUMIKO_QUEUE_PREFIX and KUMIKO_REDIS_URL set). The broker's namespace
carries the bench prefix, so every key it makes (``<namespace>:<queue>``, ``.msgs``, ``.DQ``,
``__acks__.*``, ``__heartbeats__``) falls under the bench's clean-up. Default middleware, as a
project would run it; no retries, so a failing job shows as a missing stamp, not a slow one.
"""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.peers import stamps

NAMESPACE = f"{stamps.bench_prefix()}_dramatiq"
broker = RedisBroker(url=stamps.redis_url(), namespace=NAMESPACE)  # type: ignore[no-untyped-call]
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="bench_trivial", queue_name="trivial", max_retries=0)
def trivial(key: str, expected: int, index: int) -> None:
    stamps.trivial(key, expected, index)


@dramatiq.actor(actor_name="bench_io20", queue_name="io20", max_retries=0)
def io20(key: str, expected: int, index: int) -> None:
    stamps.io20(key, expected, index)


ACTORS = {"trivial": trivial, "io20": io20}
