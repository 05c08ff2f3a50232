"""The jobs the benchmarks dispatch and run: they do (next to) nothing, so the machinery is measured."""

from __future__ import annotations

from typing import Any

from bench.peers import stamps
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


# bench/peer_rates.py: the bodies Dramatiq, Celery and RQ run too (bench/peers/stamps.py), each
# ending in the same one RPUSH of its start and end.
@job(name="bench.trivial")
def trivial(payload: dict[str, Any], ctx: JobContext) -> None:
    stamps.trivial(payload["stamps"], payload["expected"], payload["i"])


@job(name="bench.io20")
def io20(payload: dict[str, Any], ctx: JobContext) -> None:
    stamps.io20(payload["stamps"], payload["expected"], payload["i"])
