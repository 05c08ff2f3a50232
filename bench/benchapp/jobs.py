"""The job the benchmarks dispatch and run: it does nothing, so only the machinery is measured."""

from __future__ import annotations

from typing import Any

from kumiko_jobs import job
from kumiko_jobs.context import JobContext


@job(name="bench.noop")
def noop(payload: dict[str, Any], ctx: JobContext) -> None:
    return None


# bench/tenancy.py: dispatch() through a skip limit that is never reached in the bench
# (the limit check and the enqueue are one script call either way).
@job(name="bench.limited", max_per_tenant=1000)
def limited(payload: dict[str, Any], ctx: JobContext) -> None:
    return None


# bench/tenancy.py: a per-tenant job; its wrapper fans out to ACTIVE_TENANTS (bench.benchapp.tenants).
@job(name="bench.fanned", per_tenant=True)
def fanned(payload: dict[str, Any], ctx: JobContext) -> None:
    return None


# The same on the other lane: bench/tenancy.py alternates it (an empty lane) with bench.limited
# (a lane holding a deep queue of other tenants' runs) in one process and one Redis state.
@job(name="bench.limited_api", lane="api", max_per_tenant=1000)
def limited_api(payload: dict[str, Any], ctx: JobContext) -> None:
    return None
