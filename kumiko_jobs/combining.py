"""Requests of a process's job threads, sent together: what one thread would send alone goes out
with every request other threads queued meanwhile, in one call.

Why: with --threads N, a round trip per job and thread gave the GIL away at every system call,
and each time the thread then waited for it to come back while the others did the same
(BENCHMARKS.md, "Threads"). While one call is in flight the other threads run their handlers
and queue theirs, so the next call carries several. Used for the lane steps (step_batching.py).
Not for the outcome writes: sent together on one connection, PostgreSQL ran them one after the
other in one backend instead of side by side in each thread's own, and the threads waited
longer (measured: 10-30 % fewer jobs/s with 8 threads).

How: a thread that finds no call in flight leads. It sends its own request and every queued
one, then passes the lead to the first thread that queued meanwhile, and wakes the threads of
its batch with their results. A waiting thread blocks on a lock of its own, so it is woken once:
by the leader that has its result, or by the one that passes it the lead. A thread never waits
for more than the call in flight and its own.

Errors: ``send`` returns one result per request, an exception in the place of a request that
failed on its own; an exception raised by ``send`` (the server is down) is every request's.
Each thread gets its own result or exception, as if it had made the call alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence


class _Waiting[R, T]:
    __slots__ = ("error", "leads", "request", "result", "wakeup")

    def __init__(self, request: R) -> None:
        self.request = request
        self.result: T | None = None
        self.error: BaseException | None = None
        self.leads = False  # woken to lead the next call, not with a result
        self.wakeup = threading.Lock()
        self.wakeup.acquire()

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


class Combiner[R, T]:
    """``submit(request)`` from any thread; ``send(requests)`` makes the one call for a batch
    (see the module docstring)."""

    def __init__(self, send: Callable[[Sequence[R]], Sequence[T | BaseException]]) -> None:
        self._send = send
        self._mutex = threading.Lock()
        self._leading = False  # a call is in flight
        self._queued: list[_Waiting[R, T]] = []  # requests for the next call
        self.calls = 0  # calls made, and requests they carried (reported at shutdown)
        self.requests = 0

    def submit(self, request: R) -> T:
        mine: _Waiting[R, T] = _Waiting(request)
        with self._mutex:
            follows = self._leading
            if follows:
                self._queued.append(mine)
            self._leading = True
        if follows:
            mine.wakeup.acquire()
            if not mine.leads:
                return mine.outcome()
            with self._mutex:
                batch, self._queued = self._queued, []
        else:
            batch = [mine]
        try:
            self._call(batch)
        finally:
            # Even if this thread is interrupted here: nobody may be left waiting.
            self._hand_on(batch, mine)
        return mine.outcome()

    def _call(self, batch: Sequence[_Waiting[R, T]]) -> None:
        try:
            results = list(self._send([waiting.request for waiting in batch]))
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} results for {len(batch)} requests")
        except BaseException as exc:  # every request's error, raised in its own thread
            for waiting in batch:
                waiting.error = exc
            return
        self.calls += 1
        self.requests += len(batch)
        for waiting, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                waiting.error = result
            else:
                waiting.result = result

    def _hand_on(self, batch: Sequence[_Waiting[R, T]], mine: _Waiting[R, T]) -> None:
        """Pass the lead to the first queued thread (or end it), and wake the batch's threads."""
        with self._mutex:
            successor = self._queued[0] if self._queued else None
            if successor is not None:
                successor.leads = True
            else:
                self._leading = False
        for waiting in batch:
            if waiting is not mine:
                waiting.wakeup.release()
        if successor is not None:
            successor.wakeup.release()
