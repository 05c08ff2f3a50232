"""Lifecycle signals of runs, for a project's own reactions (error trackers, notifications).

Each is a Django signal sent with ``sender`` = the job name and ``run`` = a ``RunInfo``;
``job_failed`` also gets ``final`` (no attempt follows). They are sent once per transition, in
the process where it happened (a worker, or the dispatching process for ``job_queued`` and
``job_dropped``), after the run's record is written. A receiver that raises is logged and
never fails or retries a job. Receivers run on the worker's hot path: keep them quick, and
dispatch a job for slow work.

======================  ==============================================================
``job_queued``          a new run was queued (after commit when dispatched in atomic())
``job_started``         an attempt started (short runs: sent with their outcome)
``job_succeeded``       the run succeeded
``job_failed``          an attempt failed; ``final=True`` when the run failed for good
``job_deferred``        the handler deferred the run (``ctx.defer``)
``job_dropped``         a waiting run will never run (replaced, canceled, refused at commit)
======================  ==============================================================
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.dispatch import Signal


class JobSignal(Signal):
    """A Django signal whose ``sender`` is a job name. Django matches senders by identity, and
    two equal strings are often different objects, so names are interned on both sides:
    ``job_failed.connect(receiver, sender="billing.export")`` works as it reads."""

    def connect(
        self, receiver: Callable[..., Any], sender: Any = None, weak: bool = True, dispatch_uid: Any = None
    ) -> None:
        super().connect(receiver, _interned(sender), weak, dispatch_uid)

    def disconnect(
        self, receiver: Callable[..., Any] | None = None, sender: Any = None, dispatch_uid: Any = None
    ) -> bool:
        return super().disconnect(receiver, _interned(sender), dispatch_uid)

    def has_listeners(self, sender: Any = None) -> bool:
        return super().has_listeners(_interned(sender))


def _interned(sender: Any) -> Any:
    return sys.intern(sender) if type(sender) is str else sender


job_queued = JobSignal()
job_started = JobSignal()
job_succeeded = JobSignal()
job_failed = JobSignal()
job_deferred = JobSignal()
job_dropped = JobSignal()


@dataclass(frozen=True)
class RunInfo:
    """What a receiver learns about the run: never its payload.

    ``error`` is the final failure's message (scrubbed by ``SCRUBBER``, as stored on the run),
    else None.
    """

    run_id: str
    job_id: str
    job_name: str
    tenant_id: str | None
    attempt: int
    final_attempt: bool
    lane: str
    status: str
    error: str | None = None


__all__ = [
    "JobSignal",
    "RunInfo",
    "job_deferred",
    "job_dropped",
    "job_failed",
    "job_queued",
    "job_started",
    "job_succeeded",
]
