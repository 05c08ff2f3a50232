"""The job the benchmarks dispatch and run: it does nothing, so only the machinery is measured."""

from __future__ import annotations

from typing import Any

from kumiko_jobs import job
from kumiko_jobs.context import JobContext


@job(name="bench.noop")
def noop(payload: dict[str, Any], ctx: JobContext) -> None:
    return None
