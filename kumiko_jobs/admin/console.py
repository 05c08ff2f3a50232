"""The operator console's overview page: lanes and tenants now and over 24 hours, with charts.

Every figure comes from Redis (lane_stats.py): a page load is a handful of pipelined reads and
one query for the shown tenants' names, whatever the size of the run table.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.safestring import SafeString

from kumiko_jobs import lane_stats
from kumiko_jobs.admin.access import OperatorPage, tenant_names
from kumiko_jobs.admin.chart import outcome_chart
from kumiko_jobs.admin.run_columns import runs_url
from kumiko_jobs.conf import redis_description
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.flows import ANY_TENANT
from kumiko_jobs.keys import LANES
from kumiko_jobs.lane_stats import Depth, TenantDepth
from kumiko_jobs.models import ConsoleOverview

BUSIEST = 25  # tenants shown by backlog
FAILING = 10  # and by final failures in 24 h
ACTIVE = 15  # and by runs ended in 24 h


@dataclass(frozen=True)
class LaneRow:
    lane: str
    depth: Depth
    succeeded: int
    failed: int
    retried: int
    chart: SafeString


@dataclass(frozen=True)
class TenantRow:
    tenant_id: str | None
    name: str
    queued: int
    scheduled: int | None
    running: int
    succeeded: int
    failed: int
    runs_url: str


def lane_rows(client: redis.Redis) -> list[LaneRow]:
    keys = get_keys()
    rows = []
    for lane in LANES:
        hours = lane_stats.hourly(client, keys, lane)
        rows.append(
            LaneRow(
                lane=lane,
                depth=lane_stats.lane_depth(client, keys, lane),
                succeeded=sum(h.get("succeeded") for h in hours),
                failed=sum(h.get("failed") for h in hours),
                retried=sum(h.get("retried") for h in hours),
                chart=outcome_chart(hours, label=f"Lane {lane}: attempts per hour, last 24 hours"),
            )
        )
    return rows


def tenant_rows(client: redis.Redis, wanted: str | None = None) -> list[TenantRow]:
    """The tenants with the most work waiting or running, the most failing and the most active
    ones of the last 24 hours, and ``wanted`` (a tenant id searched for)."""
    keys = get_keys()
    depths: dict[str | None, TenantDepth] = {}
    for lane in LANES:
        for tenant, depth in lane_stats.tenant_depths(client, keys, lane).items():
            total = depths.setdefault(tenant, TenantDepth())
            total.queued += depth.queued
            total.running += depth.running
            total.scheduled = None if total.scheduled is None or depth.scheduled is None else (
                total.scheduled + depth.scheduled
            )  # fmt: skip
    busiest = sorted(
        depths, key=lambda t: -(depths[t].queued + depths[t].running + (depths[t].scheduled or 0))
    )
    failing = [
        tenant for tenant, _ in lane_stats.ranked_tenants(client, keys, failures_only=True, limit=FAILING)
    ]
    active = [tenant for tenant, _ in lane_stats.ranked_tenants(client, keys, limit=ACTIVE)]
    shown = list(dict.fromkeys([*([wanted] if wanted else []), *busiest[:BUSIEST], *failing, *active]))
    outcomes = lane_stats.tenant_outcomes(client, keys, [t for t in shown if t != ANY_TENANT])
    names = tenant_names(shown)
    rows = []
    for tenant in shown:
        depth = depths.get(tenant, TenantDepth(scheduled=None if _unattributed(depths) else 0))
        counts = outcomes.get(tenant) or Counter()
        rows.append(
            TenantRow(
                tenant_id=tenant,
                name=_tenant_label(tenant, names),
                queued=depth.queued,
                scheduled=depth.scheduled,
                running=depth.running,
                succeeded=counts.get("succeeded", 0),
                failed=counts.get("failed", 0),
                runs_url=runs_url(tenant=tenant or "-") if tenant != ANY_TENANT else runs_url(),
            )
        )
    return rows


def _unattributed(depths: dict[str | None, TenantDepth]) -> bool:
    return any(depth.scheduled is None for depth in depths.values())


def _tenant_label(tenant: str | None, names: dict[str, str]) -> str:
    if tenant is None:
        return "(no tenant)"
    if tenant == ANY_TENANT:
        return "(job-scoped flows, any tenant)"
    return names.get(tenant, "")


# ModelAdmin is generic only in django-stubs (see audits.py).
if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[ConsoleOverview]
else:
    _ModelAdmin = admin.ModelAdmin


@admin.register(ConsoleOverview)
class ConsoleOverviewAdmin(OperatorPage, _ModelAdmin):
    """The overview page in place of a change list (the proxy model gives it a place in the index)."""

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [path("", self.admin_site.admin_view(self.overview_view), name=f"{info}_changelist")]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            return HttpResponse("Operators only.", status=403)
        wanted = request.GET.get("tenant", "").strip() or None
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "title": "Background jobs: overview",
            "opts": self.opts,
            "wanted": wanted or "",
            "failed_url": runs_url(status__exact="failed"),
            "queued_url": runs_url(status__exact="queued"),
            "running_url": runs_url(status__exact="running"),
        }
        client = get_redis()
        try:
            context["lanes"] = lane_rows(client)
            context["tenants"] = tenant_rows(client, wanted)
        except redis.RedisError as exc:
            # Never the URL itself: it may hold the password.
            context["redis_error"] = f"Redis at {redis_description()} did not answer: {exc}"
        return TemplateResponse(request, "admin/kumiko_jobs/overview.html", context)
