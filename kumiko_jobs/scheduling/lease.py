"""The lane's scheduler lease: one leader among the lane's runjobs processes, with a fencing token.

The lease is a Redis key holding ``"<epoch>|<owner>"`` with a TTL, renewed by its holder; the
epoch grows with every acquisition, so a token names one tenure, never a process. The leader
renews from its scheduling loop, so a leader that stops making progress (killed, frozen, wedged)
stops renewing and is replaced within LEASE_SECONDS + FOLLOW_INTERVAL.

Fencing: every push of a tick is made with ``pushing.push_watched`` watching the lease key and
checking it still holds this token, so the check and the push are one Redis transaction. A
leader paused past its lease (GC, SIGSTOP, a slow disk) wakes up holding a stale token and its
push is refused; it cannot fire after losing the lease.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
from redis.client import Pipeline
from rq.utils import as_text

from kumiko_jobs.keys import Keys

LEASE_SECONDS = 10.0
RENEW_INTERVAL = LEASE_SECONDS / 4
FOLLOW_INTERVAL = 1.0  # how often a follower tries to take a free lease


class LeaderLease:
    def __init__(self, client: redis.Redis, keys: Keys, lane: str, owner: str) -> None:
        self.client = client
        self.key = keys.scheduler_lease(lane)
        self._epoch_key = keys.scheduler_epoch(lane)
        self.owner = owner

    def acquire(self) -> str | None:
        """Take the lease if it is free; the token if this process now leads, else None."""
        if self.client.exists(self.key):
            return None
        epoch = self.client.incr(self._epoch_key)
        token = f"{epoch}|{self.owner}"
        if self.client.set(self.key, token, nx=True, px=int(LEASE_SECONDS * 1000)):
            return token
        return None  # taken between the check and the set: that epoch number stays unused

    def renew(self, token: str) -> bool:
        """Extend the lease if ``token`` still holds it."""
        return self._if_held(token, lambda pipe: pipe.pexpire(self.key, int(LEASE_SECONDS * 1000)))

    def release(self, token: str) -> bool:
        """Give the lease up at once (a clean shutdown hands over without waiting for the TTL)."""
        return self._if_held(token, lambda pipe: pipe.delete(self.key))

    def holds(self, pipe: Pipeline, token: str) -> bool:
        """For a watching pipeline: does ``token`` hold the lease right now?"""
        return pipe.get(self.key) == token.encode()

    def holder(self) -> str | None:
        raw = self.client.get(self.key)
        return as_text(raw) if raw is not None else None

    def _if_held(self, token: str, write: Callable[[Pipeline], Any]) -> bool:
        return write_if_value(self.client, self.key, token, write)


def write_if_value(client: redis.Redis, key: str, value: str, write: Callable[[Pipeline], Any]) -> bool:
    """Run ``write`` in a transaction only while ``key`` holds ``value`` (a lease's or a lock's
    token): False if it holds another, or changed before the write."""
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(key)  # type: ignore[no-untyped-call]
            if pipe.get(key) != value.encode():
                pipe.reset()
                return False
            pipe.multi()
            write(pipe)
            pipe.execute()
        except redis.WatchError:
            return False
    return True
