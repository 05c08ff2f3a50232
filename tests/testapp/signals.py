"""Records every kumiko_jobs lifecycle signal in Redis under the test's prefix, so tests read
what was sent, in this process or in a runjobs subprocess (tests/test_signals.py)."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from django.dispatch import Signal

from kumiko_jobs import signals
from kumiko_jobs.connection import get_keys, get_redis

SIGNALS = ("job_queued", "job_started", "job_succeeded", "job_failed", "job_deferred", "job_dropped")


def signals_key() -> str:
    return f"{get_keys().prefix}:signals"


def record(sender: str, signal: Signal, run: signals.RunInfo, **extra: Any) -> None:
    name = next(n for n in SIGNALS if getattr(signals, n) is signal)
    entry = {"signal": name, "sender": sender, "run": dataclasses.asdict(run), "pid": os.getpid()}
    if "final" in extra:
        entry["final"] = extra["final"]
    get_redis().rpush(signals_key(), json.dumps(entry))


def connect() -> None:
    for name in SIGNALS:
        getattr(signals, name).connect(record, dispatch_uid=f"tests-record-{name}")
