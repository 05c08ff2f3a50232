"""The job catalog page: every declared job with its lane, triggers, next fire time and last
success (``jobs list``'s catalog, kumiko_jobs/catalog.py), its 24-hour failure rate, and a Trigger form
that dispatches it through ``dispatch()``."""

from __future__ import annotations

import inspect
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import redis
from django.contrib import admin, messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from kumiko_jobs import lane_stats
from kumiko_jobs.admin.access import OperatorPage
from kumiko_jobs.admin.run_columns import run_url, runs_url
from kumiko_jobs.admin.trigger_form import TriggerForm
from kumiko_jobs.catalog import job_catalog
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.definitions import JobDefinition
from kumiko_jobs.exceptions import KumikoJobsError
from kumiko_jobs.models import JobCatalog
from kumiko_jobs.registry import registry
from kumiko_jobs.scheduling.specs import trigger_labels


@dataclass(frozen=True)
class CatalogRow:
    definition: JobDefinition
    triggers: list[str]
    next_fire: datetime | None
    last_success: datetime | None
    succeeded: int
    failed: int

    @property
    def failure_rate(self) -> float | None:
        """Final failures per ended run over 24 hours; None without any."""
        ended = self.succeeded + self.failed
        return self.failed / ended if ended else None


def labels_of(definition: JobDefinition) -> list[str]:
    return [label for trigger in definition.triggers for label in trigger_labels(trigger)]


def catalog_rows() -> tuple[list[CatalogRow], str | None]:
    """The catalog (``jobs list``'s: next fire time, last success), sorted by name, with the
    24-hour counts; and a note when Redis was unreadable."""
    try:
        outcomes = lane_stats.job_outcomes(get_redis(), get_keys())
        infos = job_catalog()
    except redis.RedisError as exc:
        return [], f"The catalog needs Redis, which did not answer ({exc})."
    rows = []
    for info in infos:
        d, counts = info.definition, outcomes.get(info.definition.name, Counter())
        next_fire = info.next_fire.utc if info.next_fire else None
        rows.append(
            CatalogRow(
                d, labels_of(d), next_fire, info.last_success_at, counts["succeeded"], counts["failed"]
            )
        )
    return rows, None


# ModelAdmin is generic only in django-stubs (see audits.py).
if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[JobCatalog]
else:
    _ModelAdmin = admin.ModelAdmin


@admin.register(JobCatalog)
class JobCatalogAdmin(OperatorPage, _ModelAdmin):
    """The catalog in place of a change list, and ``trigger/<job name>/``."""

    def get_urls(self) -> list[URLPattern]:
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", self.admin_site.admin_view(self.catalog_view), name=f"{info}_changelist"),
            path(
                "trigger/<path:name>/",
                self.admin_site.admin_view(self.trigger_view),
                name=f"{info}_trigger",
            ),
        ]

    def catalog_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            return HttpResponse("Operators only.", status=403)
        rows, note = catalog_rows()
        context = {
            **self.admin_site.each_context(request),
            "title": "Background jobs: job catalog",
            "opts": self.opts,
            "rows": [
                (row, runs_url(job_name=row.definition.name), _trigger_url(row.definition.name))
                for row in rows
            ],
            "note": note,
        }
        return TemplateResponse(request, "admin/kumiko_jobs/catalog.html", context)

    def trigger_view(self, request: HttpRequest, name: str) -> HttpResponse:
        if not self.has_view_permission(request):
            return HttpResponse("Operators only.", status=403)
        definition = registry.find(name)
        if definition is None:
            raise Http404(f"No job named {name!r} is declared.")
        form = TriggerForm(definition, request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                result = form.dispatch(user=request.user)
            except KumikoJobsError as exc:
                form.add_error(None, str(exc))
            else:
                if result.status == "queued" and result.run_id:
                    link = format_html('<a href="{}">run {}</a>', run_url(result.run_id), result.run_id)
                    self.message_user(
                        request, format_html("Dispatched {}: {}.", name, link), messages.SUCCESS
                    )
                    return HttpResponseRedirect(reverse("admin:kumiko_jobs_jobcatalog_changelist"))
                form.add_error(None, f"Not queued: {result.status} ({result.reason}).")
        context = {
            **self.admin_site.each_context(request),
            "title": f"Trigger {name}",
            "opts": self.opts,
            "definition": definition,
            "doc": inspect.getdoc(definition.func) or "",
            "triggers": labels_of(definition),
            "form": form,
        }
        return TemplateResponse(request, "admin/kumiko_jobs/trigger.html", context)


def _trigger_url(name: str) -> str:
    return reverse("admin:kumiko_jobs_jobcatalog_trigger", args=[name])
