"""The lane steps of a --threads process's job threads, sent together (combining.py): one
script call finishes the attempts and claims the jobs of every thread that reached its step
while the previous call was in flight.

What a batch keeps from separate calls (lane.step): claims are taken one after the other from
the ring, so fairness and tenant caps are the same; every claim has its thread's own execution
id and lease member, and a thread only runs the job it claimed. A failed call (Redis down)
fails every step of its batch, and each thread handles the error as its own call's: the
finished attempt is kept and sent again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from kumiko_jobs.combining import Combiner
from kumiko_jobs.keys import Keys
from kumiko_jobs.lane import Claim, ClaimedJob, Finished, step

Step = tuple[Finished | None, Claim | None]


class StepBatcher(Combiner[Step, ClaimedJob | None]):
    """lane.finish_and_claim for the job loops of one worker process (a single-thread worker's
    steps go through it too, one call each, on its own connection)."""

    def __init__(self, client: redis.Redis, keys: Keys, lane: str) -> None:
        super().__init__(self._send_steps)
        self.client, self.keys, self.lane = client, keys, lane
        # Taken from the pool on the first call and kept: only the leading thread uses it.
        self._connection: Any = None

    def close(self) -> None:
        """Give the batcher's connection back to the pool (the worker stops)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self.client.connection_pool.release(connection)

    def finish_and_claim(self, finished: Finished | None, claim: Claim | None) -> ClaimedJob | None:
        return self.submit((finished, claim))

    def _send_steps(self, steps: Sequence[Step]) -> list[ClaimedJob | None]:
        finished = [done for done, _claim in steps if done is not None]
        claims = [claim for _done, claim in steps if claim is not None]
        if self._connection is None:
            self._connection = self.client.connection_pool.get_connection()
        jobs = iter(step(self.client, self.keys, self.lane, finished, claims, connection=self._connection))
        # The claimed jobs in claim order; claims past the lane's end get None.
        return [next(jobs, None) if claim is not None else None for _done, claim in steps]
