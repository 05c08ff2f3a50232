"""The run browser: a read-only list and detail page of ``JobRun``, plus "retry failed"."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from kumiko_jobs.admin.access import is_operator, staff_tenant_id, tenant_names
from kumiko_jobs.admin.changelist import CappedCountPaginator, RunChangeList, RunQuerySet
from kumiko_jobs.admin.filters import CorrelationFilter, JobNameFilter, LaneFilter, TenantFilter
from kumiko_jobs.exceptions import KumikoJobsError, QueueUnavailable
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.retrying import retry_failed

# The retry action dispatches one job per run; a "select all" over millions must not.
RETRY_LIMIT = 100
STATUS_COLORS: dict[str, str] = {
    RunStatus.QUEUED: "#64748b", RunStatus.RUNNING: "#2563eb", RunStatus.SUCCEEDED: "#15803d",
    RunStatus.FAILED: "#b91c1c", RunStatus.DEFERRED: "#b45309", RunStatus.DROPPED: "#6b7280",
}  # fmt: skip
# ModelAdmin is generic only in django-stubs (see audits.py).
if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[JobRun]
else:
    _ModelAdmin = admin.ModelAdmin
BADGE = '<span style="background:{};color:#fff;border-radius:.6em;padding:0 .6em">{}</span>'


@admin.register(JobRun)
class JobRunAdmin(_ModelAdmin):
    list_display = (
        "status_badge", "job_name", "tenant", "attempts", "lane", "queued_at", "started_at", "finished_at",
        "duration", "correlation",
    )  # fmt: skip
    list_display_links = ("job_name",)
    list_filter = ("status", JobNameFilter, LaneFilter, TenantFilter, CorrelationFilter)
    # Exact lookups only, so each uses an index; a term that is not a UUID skips the id.
    search_fields = ("job_id__exact", "id__exact", "correlation_id__exact")
    search_help_text = "Exact job id, run id or correlation id."
    date_hierarchy = "queued_at"
    ordering = ("-queued_at",)
    # Sorting by any other column would sort the whole table to show one page.
    sortable_by = ("queued_at",)
    list_per_page = 50
    list_max_show_all = 200
    show_full_result_count = False
    # Facets are one COUNT per filter choice over the filtered table.
    show_facets = admin.ShowFacets.NEVER
    paginator = CappedCountPaginator
    actions = ("retry_failed_runs",)
    readonly_fields = (
        "status_badge", "tenant", "attempts", "duration", "traceback_text", "payload_json", "log_lines",
    )  # fmt: skip
    fieldsets_for_staff = (
        (None, {"fields": ("id", "job_name", "status_badge", "tenant", "attempts", "lane", "job_id")}),
        ("Trigger", {"fields": ("subject", "trigger_name", "triggered_by", "correlation_id")}),
        ("Timing", {"fields": (
            "queued_at", "started_at", "finished_at", "duration", "next_attempt_at", "updated_at", "worker",
        )}),
        ("Deferrals and fan-out", {"fields": ("defer_count", "fanout_count")}),
    )  # fmt: skip
    fieldsets_for_operators = (
        *fieldsets_for_staff,
        ("Outcome", {"fields": ("error", "traceback_text")}),
        ("Logs", {"fields": ("log_lines",)}),
        ("Payload", {"fields": ("payload_json",)}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobRun]:
        queryset = super().get_queryset(request)
        # The same query as a RunQuerySet, whose date hierarchy stays cheap.
        queryset = RunQuerySet(model=queryset.model, query=queryset.query, using=queryset.db)
        if is_operator(request):
            return queryset
        tenant = staff_tenant_id(request)
        return queryset.none() if tenant is None else queryset.filter(tenant_id=tenant)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RunChangeList

    def get_list_filter(self, request: HttpRequest) -> Any:
        # Tenant staff see one tenant only: a tenant filter would list the others.
        return (
            self.list_filter
            if is_operator(request)
            else ("status", JobNameFilter, LaneFilter, CorrelationFilter)
        )

    def get_fieldsets(self, request: HttpRequest, obj: JobRun | None = None) -> Any:
        return self.fieldsets_for_operators if is_operator(request) else self.fieldsets_for_staff

    def has_view_permission(self, request: HttpRequest, obj: JobRun | None = None) -> bool:
        allowed = super().has_view_permission(request, obj)
        return allowed and (is_operator(request) or staff_tenant_id(request) is not None)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: JobRun | None = None) -> bool:
        # Runs change only through the library: False makes the detail page read-only.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: JobRun | None = None) -> bool:
        return False

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return is_operator(request)

    @admin.display(description="status")
    def status_badge(self, run: JobRun) -> SafeString:
        color = STATUS_COLORS.get(run.status, "#6b7280")
        return format_html(BADGE, color, run.get_status_display())

    @admin.display(description="tenant")
    def tenant(self, run: JobRun) -> str:
        if run.tenant_id is None:
            return "-"
        # RunChangeList sets the names of a whole page; the detail page looks up its one run.
        if "tenant_name" in vars(run):
            name = vars(run)["tenant_name"]
        else:
            name = tenant_names([run.tenant_id]).get(run.tenant_id)
        return f"{run.tenant_id} · {name}" if name else run.tenant_id

    @admin.display(description="attempt")
    def attempts(self, run: JobRun) -> str:
        return f"{run.attempt}/{run.max_attempts}"

    @admin.display(description="duration")
    def duration(self, run: JobRun) -> str:
        if run.started_at is None or run.finished_at is None:
            return "-"
        return format_duration(run.finished_at - run.started_at)

    @admin.display(description="correlation")
    def correlation(self, run: JobRun) -> SafeString | str:
        # A link to every run of the same request or chain; the id is long, the cell short.
        if not run.correlation_id:
            return "-"
        query = urlencode({CorrelationFilter.parameter_name: run.correlation_id})
        short = run.correlation_id if len(run.correlation_id) <= 12 else f"{run.correlation_id[:10]}…"
        return format_html('<a href="?{}" title="{}">{}</a>', query, run.correlation_id, short)

    @admin.display(description="traceback")
    def traceback_text(self, run: JobRun) -> SafeString | str:
        return format_html("<pre>{}</pre>", run.traceback) if run.traceback else "-"

    @admin.display(description="payload")
    def payload_json(self, run: JobRun) -> SafeString:
        pretty = json.dumps(run.payload, indent=2, sort_keys=True, ensure_ascii=False)
        return format_html("<pre>{}</pre>", pretty)

    @admin.display(description="log")
    def log_lines(self, run: JobRun) -> SafeString | str:
        if not run.logs:
            return "-"
        lines = (
            (_log_time(line.get("t")), line.get("level", ""), line.get("attempt", "?"), line.get("msg", ""))
            for line in run.logs
        )
        return format_html("<pre>{}</pre>", format_html_join("\n", "{} {} [{}] {}", lines))

    @admin.action(description="Retry selected failed runs", permissions=["retry"])
    def retry_failed_runs(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> None:
        fields = ("id", "job_name", "tenant_id", "status", "payload", "correlation_id", "job_id", "fanout_of")
        runs = list(queryset.only(*fields)[: RETRY_LIMIT + 1])
        if len(runs) > RETRY_LIMIT:
            self.message_user(request, f"Select at most {RETRY_LIMIT} runs to retry at once.", messages.ERROR)
            return
        retried, skipped = 0, []
        for run in runs:
            if run.status != RunStatus.FAILED:
                skipped.append(f"{run.job_name} {run.pk} ({run.status})")
                continue
            try:
                # A fan-out wrapper's retry reaches only the tenants the original did not.
                result = retry_failed(run, user=request.user)
            except QueueUnavailable as exc:
                stopped = f"Re-dispatched {retried} failed runs, then stopped: {exc}"
                self.message_user(request, stopped, messages.ERROR)
                return
            except KumikoJobsError as exc:  # job no longer declared, tenant deleted, ...
                skipped.append(f"{run.job_name} {run.pk} ({exc})")
                continue
            if result.status == "queued":
                retried += 1
            else:
                skipped.append(f"{run.job_name} {run.pk} (not queued: {result.reason})")
        level = messages.SUCCESS if retried else messages.INFO
        self.message_user(request, f"Re-dispatched {retried} failed runs.", level)
        if skipped:
            self.message_user(request, f"Skipped {len(skipped)}: {'; '.join(skipped)}.", messages.WARNING)


def format_duration(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _log_time(value: Any) -> str:
    # Lines carry UTC ISO times; show them in the admin's time zone, to the second.
    try:
        return timezone.localtime(datetime.fromisoformat(value)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError):
        return str(value or "")
