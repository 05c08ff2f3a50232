"""Counts of ended attempts for the console's 24-hour figures, tallied in the worker process and
handed to Redis in batches with the finish-and-claim call the worker makes anyway.

Counting each attempt in Redis on its own would add three commands to every job's script call;
a tally flushed at most once per ``FLUSH_INTERVAL`` (and whenever a call claims nothing next,
e.g. at shutdown or in ``testing.drain()``) adds them once per distinct (hour, outcome, job,
tenant) per interval instead. A process that dies loses at most its last interval of counts:
they are dashboard figures, the run records stay the history.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

# Outcomes the console counts (Outcome.counted_as); "requeued" is bookkeeping, not an attempt.
COUNTED_OUTCOMES = frozenset({"succeeded", "failed", "retried", "deferred"})
FLUSH_INTERVAL = 1.0
MAX_ENTRIES = 500  # per script call; the rest waits for the next one

Entry = tuple[int, str, str, str]  # hour, outcome, job name, tenant ('' = none)


class OutcomeTally:
    """Thread-safe per-lane counters of ended attempts, taken in batches (one per process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, Counter[Entry]] = {}
        self._next_flush: dict[str, float] = {}

    def add(
        self, lane: str, outcome: str, job_name: str, tenant_id: str | None, now: float, n: int = 1
    ) -> None:
        """Count an ended attempt; ``n=-1`` takes back one whose call failed (lane.step)."""
        if outcome not in COUNTED_OUTCOMES:
            return
        with self._lock:
            counts = self._counts.setdefault(lane, Counter())
            entry = (int(now // 3600), outcome, job_name, tenant_id or "")
            counts[entry] += n
            if counts[entry] == 0:
                del counts[entry]

    def take(self, lane: str, *, force: bool = False) -> list[str | int]:
        """The lane's counts as script arguments (hour, outcome, count, job, tenant per entry), if
        a flush is due (or ``force``); else nothing."""
        with self._lock:
            counts = self._counts.get(lane)
            if not counts:
                return []
            now = time.monotonic()
            if not force and now < self._next_flush.get(lane, 0.0) and len(counts) < MAX_ENTRIES:
                return []
            self._next_flush[lane] = now + FLUSH_INTERVAL
            entries = list(counts.items())[:MAX_ENTRIES]
            for entry, _ in entries:
                del counts[entry]
        return [
            item for (hour, outcome, job, tenant), n in entries for item in (hour, outcome, n, job, tenant)
        ]

    def give_back(self, lane: str, items: list[str | int]) -> None:
        """Counts taken for a script call that failed (Redis down): counted with the next one."""
        with self._lock:
            counts = self._counts.setdefault(lane, Counter())
            for i in range(0, len(items), 5):
                hour, outcome, n, job, tenant = items[i : i + 5]
                counts[(int(hour), str(outcome), str(job), str(tenant))] += int(n)


tally = OutcomeTally()
