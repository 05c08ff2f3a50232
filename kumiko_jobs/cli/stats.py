"""``jobs stats``: per lane, queued, scheduled (delayed), running and failed jobs in Redis, and
the tenants with the most unfinished runs."""

from __future__ import annotations

from typing import Any

import redis
from django.db.models import Count
from rq.utils import as_text

from kumiko_jobs.cli.base import Output, Subcommand
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.flows import is_ordered
from kumiko_jobs.keys import LANES, Keys
from kumiko_jobs.models import ACTIVE_STATUSES, JobRun
from kumiko_jobs.rebuild import owned_by

BUSIEST = 5


def lane_counts(client: redis.Redis, keys: Keys, lane: str) -> dict[str, int]:
    """Queued = the lengths of the lane's flows that hold work (O(flows with work)) plus RQ's
    plain list; scheduled, running and failed are the sizes of RQ's registries (failed ones are
    kept FAILURE_TTL)."""
    flows = [as_text(flow) for flow in client.hkeys(keys.flow_states(lane))]
    pipe = client.pipeline(transaction=False)
    pipe.llen(keys.queue(lane))
    for flow in flows:
        if is_ordered(flow):  # a Django task's flow: a sorted set
            pipe.zcard(keys.flow(lane, flow))
        else:
            pipe.llen(keys.flow(lane, flow))
    queued = sum(int(n) for n in pipe.execute())
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.scheduled(lane))
    pipe.zcard(keys.started(lane))
    pipe.zcard(keys.failed(lane))
    scheduled, running, failed = (int(n) for n in pipe.execute())
    return {"queued": queued, "scheduled": scheduled, "running": running, "failed": failed}


def lane_stats() -> dict[str, dict[str, int]]:
    client, keys = get_redis(), get_keys()
    return {lane: lane_counts(client, keys, lane) for lane in LANES}


def busiest_tenants(lane: str, limit: int = BUSIEST) -> list[tuple[str, int]]:
    """Tenants with the most queued, running or deferred runs of this deployment (QUEUE_PREFIX):
    a database shared by several counts each one's runs only."""
    # PostgreSQL finds the rows through the small partial index of unfinished runs
    # (kj_run_active) and only filters them by job id prefix: LIKE 'tag-%' gets no index of its
    # own (job_id's unique index serves LIKE only under the C collation), and needs none here.
    # owned_by is repair's scope too; the runs it leaves out, boot gates', have no tenant.
    rows = (
        JobRun.objects.filter(
            owned_by(get_keys()), lane=lane, status__in=ACTIVE_STATUSES, tenant_id__isnull=False
        )
        .values("tenant_id")
        .annotate(runs=Count("id"))
        .order_by("-runs", "tenant_id")[:limit]
    )
    return [(str(row["tenant_id"]), int(row["runs"])) for row in rows]


class Stats(Subcommand):
    name = "stats"
    help = "Per lane: queued, scheduled, running and failed jobs, and the busiest tenants."
    json_option = True

    def run(self, options: dict[str, Any], out: Output) -> None:
        stats = lane_stats()
        if out.as_json:
            out.json(stats)
            return
        columns = ("queued", "scheduled", "running", "failed")
        rows = []
        for lane, counts in stats.items():
            busiest = ", ".join(f"{tenant} ({runs})" for tenant, runs in busiest_tenants(lane)) or "-"
            rows.append((lane, *(f"{counts[c]:,}" for c in columns), busiest))
        out.table("Lanes", ("lane", *columns, "busiest tenants (unfinished runs)"), rows)
