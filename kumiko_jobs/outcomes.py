"""What a worker claimed and what it tells Redis about the attempt (see scripts.STEP)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

OutcomeKind = Literal["ok", "failed", "retry", "requeue"]


@dataclass
class Outcome:
    """What the worker tells Redis about a finished attempt (see scripts.STEP)."""

    kind: OutcomeKind
    meta: str = ""
    retry_at: float = 0.0
    exc_info: bytes = b""
    ttl: int = 0
    counted_as: str = field(default="", compare=False)  # succeeded|failed|retried|deferred|requeued
    # Of the finished run: the flow whose cap slot it frees and the limits it stops counting in.
    flow: str = ""
    limit_keys: str = ""
    # The job's flow under the current deploy, when it differs from ``flow`` (a changed cap).
    current_flow: str = ""


@dataclass
class ClaimedJob:
    job_id: str
    data: bytes
    meta_raw: bytes
