"""Time-based runs: leader-elected cron schedules per lane, per-tenant local time, boot jobs and
boot gates. One concern per module:

``cronmath`` (which UTC instants an expression names in a zone, DST rules), ``specs`` (what a
schedule is and how its ticks are named), ``lease`` (the lane's leader lease and its fencing
token), ``zones`` (the tenant zone index), ``firing`` (a tick through the dispatch path, once),
``planner`` (which ticks are due, catch-up), ``registration`` ("seen" stamps and orphans),
``loop`` (the scheduler thread of ``runjobs``), ``boot_jobs`` and ``boot_gates``.
"""

from __future__ import annotations

__all__ = ["refresh_tenant_zones"]


def refresh_tenant_zones() -> int:
    """Rebuild the tenant zone index now (after tenants changed their time zone) instead of
    waiting up to ``TENANT_ZONE_REFRESH`` seconds; returns the number of tenants indexed."""
    from kumiko_jobs.scheduling.zones import rebuild_zone_index

    return rebuild_zone_index().tenants
