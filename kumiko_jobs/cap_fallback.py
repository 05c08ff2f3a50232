"""The fallback for runs that reach a worker over their (job, tenant) cap.

The fair dequeue never hands out a run of a capped flow at its cap. Only a run queued under an
older, higher cap (a deploy lowered ``max_per_tenant``, or made a job sequential) can start
over the new cap: such a run is put back with a growing delay, ``min(defer_ms * 2**min(n, 6),
60 s) + random[0, defer_ms)``, without consuming an attempt. The check is one string
comparison for every other run.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime

from kumiko_jobs import attempt_records, put_back
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.definitions import JobDefinition
from kumiko_jobs.flows import cap_of
from kumiko_jobs.gates import gates_for
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.outcomes import Outcome

MAX_DELAY_MS = 60_000


def defer_over_lowered_cap(
    definition: JobDefinition, meta: JobMeta, start: attempt_records.Started
) -> Outcome | None:
    flow = gates_for(definition, meta.tenant_id, get_keys()).flow
    capped = cap_of(flow) if flow != meta.flow else None
    if capped is None:
        return None
    cap, counter = capped
    # The claim counted this run under the same (job, tenant) key, so "over" means > cap.
    running = int(get_redis().hget(get_keys().running(meta.lane), counter) or 0)
    if running <= cap:
        return None
    defer_ms = definition.max_per_tenant.defer_ms if definition.max_per_tenant else 1000
    line = {
        "t": datetime.now(UTC).isoformat(),
        "level": "info",
        "msg": f"waiting: {running - 1} runs of this job and tenant are running, the cap is now {cap}",
        "attempt": meta.attempt,
    }
    return put_back.held_back(
        definition,
        meta,
        start,
        delay_ms=fallback_delay_ms(defer_ms, meta.cap_defers),
        line=line,
        cap_defers=meta.cap_defers + 1,
    )


def fallback_delay_ms(defer_ms: int, deferrals: int) -> int:
    """Grows per deferral, capped at a minute, with jitter so held-back runs do not return together."""
    grown: int = min(defer_ms * 2 ** min(deferrals, 6), MAX_DELAY_MS)
    return grown + random.randrange(defer_ms)  # noqa: S311
