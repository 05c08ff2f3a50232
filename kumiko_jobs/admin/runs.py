"""The run browser: a read-only list and detail page of ``JobRun``, with retry and cancel.

Operators see every column, the error summary and the links between related runs. Tenant
staff see their tenant's tenant-visible runs only, and of them only ``STAFF_RUN_FIELDS``:
the queryset loads nothing else, the filters accept no other lookups (``?error__icontains=``
is refused, not ignored), and they have no actions.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.db.models.functions import Substr
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from kumiko_jobs.admin import run_columns
from kumiko_jobs.admin.access import STAFF_RUN_FIELDS, is_operator, staff_tenant_id, tenant_names
from kumiko_jobs.admin.changelist import CappedCountPaginator, RunChangeList, RunQuerySet
from kumiko_jobs.admin.filters import CorrelationFilter, JobNameFilter, LaneFilter, TenantFilter
from kumiko_jobs.admin.run_actions import cancel_queued_runs, retry_failed_runs
from kumiko_jobs.models import JobRun

# Filter lookups a query string may use; any other one is refused with 400 (Django's default
# would allow every local field, so ?error__icontains=... could probe hidden text). The
# ``__exact`` spellings are the ones Django's own list filters put in URLs.
STAFF_LOOKUPS = frozenset(
    {
        "status",
        "status__exact",
        "status__isnull",
        "job_name",
        "job_name__exact",
        "lane",
        "lane__exact",
        "queued_at__year",
        "queued_at__month",
        "queued_at__day",
    }
)
OPERATOR_LOOKUPS = STAFF_LOOKUPS | {
    "tenant",
    "tenant_id",
    "tenant_id__exact",
    "tenant_id__isnull",
    "retry_of",
    "fanout_parent",
    "correlation_id",
    "job_id",
}
# ModelAdmin is generic only in django-stubs (see audits.py).
if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[JobRun]
else:
    _ModelAdmin = admin.ModelAdmin


@admin.register(JobRun)
class JobRunAdmin(_ModelAdmin):
    list_display = (
        "status_badge", "job_name", "tenant", "attempts", "lane", "queued_at", "duration", "error_summary",
        "correlation", "related",
    )  # fmt: skip
    staff_list_display = ("status_badge", "job_name", "subject", "queued_at", "started_at", "finished_at")
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
    actions = (retry_failed_runs, cancel_queued_runs)
    readonly_fields = (
        "status_badge", "tenant", "attempts", "duration", "traceback_text", "payload_json", "log_lines",
        "related_runs",
    )  # fmt: skip
    fieldsets_for_staff = (
        (None, {"fields": ("job_name", "status_badge", "subject", "queued_at", "started_at", "finished_at")}),
    )
    fieldsets_for_operators = (
        (None, {"fields": ("id", "job_name", "status_badge", "tenant", "attempts", "lane", "job_id")}),
        ("Trigger", {"fields": ("subject", "trigger_name", "triggered_by", "correlation_id")}),
        ("Timing", {"fields": (
            "queued_at", "started_at", "finished_at", "duration", "next_attempt_at", "updated_at", "worker",
        )}),
        ("Related runs", {"fields": ("related_runs",)}),
        ("Deferrals and fan-out", {"fields": ("defer_count", "fanout_count")}),
        ("Outcome", {"fields": ("error", "traceback_text")}),
        ("Logs", {"fields": ("log_lines",)}),
        ("Payload", {"fields": ("payload_json",)}),
    )  # fmt: skip

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobRun]:
        queryset = super().get_queryset(request)
        # The same query as a RunQuerySet, whose date hierarchy stays cheap.
        queryset = RunQuerySet(model=queryset.model, query=queryset.query, using=queryset.db)
        if is_operator(request):
            return queryset
        tenant = staff_tenant_id(request)
        if tenant is None:
            return queryset.none()
        return queryset.filter(tenant_id=tenant, tenant_visible=True).only(*STAFF_RUN_FIELDS)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return RunChangeList

    def get_list_display(self, request: HttpRequest) -> Any:
        return self.list_display if is_operator(request) else self.staff_list_display

    def get_list_filter(self, request: HttpRequest) -> Any:
        # Tenant staff see one tenant only: a tenant filter would list the others.
        # Staff: nothing that is not theirs to see (a correlation id is not).
        return self.list_filter if is_operator(request) else ("status", JobNameFilter)

    def get_search_fields(self, request: HttpRequest) -> Any:
        return self.search_fields if is_operator(request) else ("id__exact",)

    def get_fieldsets(self, request: HttpRequest, obj: JobRun | None = None) -> Any:
        return self.fieldsets_for_operators if is_operator(request) else self.fieldsets_for_staff

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        return lookup in (OPERATOR_LOOKUPS if is_operator(request) else STAFF_LOOKUPS)

    def list_rows(self, request: HttpRequest, queryset: QuerySet[JobRun]) -> QuerySet[JobRun]:
        """The list's rows: operators get the start of the error, cut by the database."""
        if is_operator(request):
            return queryset.annotate(error_head=Substr("error", 1, run_columns.ERROR_SUMMARY))
        return queryset

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

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return is_operator(request)

    @admin.display(description="status")
    def status_badge(self, run: JobRun) -> SafeString:
        return run_columns.status_badge(run)

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
        return run_columns.run_duration(run)

    @admin.display(description="error")
    def error_summary(self, run: JobRun) -> str:
        return run_columns.error_summary(run)

    @admin.display(description="related")
    def related(self, run: JobRun) -> SafeString:
        return run_columns.list_links(run)

    @admin.display(description="related runs")
    def related_runs(self, run: JobRun) -> SafeString:
        return run_columns.related_runs(run)

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


format_duration = run_columns.format_duration


def _log_time(value: Any) -> str:
    # Lines carry UTC ISO times; show them in the admin's time zone, to the second.
    try:
        return timezone.localtime(datetime.fromisoformat(value)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError):
        return str(value or "")
