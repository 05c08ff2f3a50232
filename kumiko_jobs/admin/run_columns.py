"""How the run browser shows a run: status badges, durations, error summaries and the links
between related runs (a retry and its original, a fan-out wrapper and its children, a chain).

List links are built from the row's own fields, so a page of 50 runs costs no query per row;
the detail page adds the one lookup that needs a query (the retries of a run, by index).
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from kumiko_jobs.definitions import wrapped_job
from kumiko_jobs.models import JobRun, RunStatus

STATUS_COLORS: dict[str, str] = {
    RunStatus.QUEUED: "#64748b", RunStatus.RUNNING: "#2563eb", RunStatus.SUCCEEDED: "#15803d",
    RunStatus.FAILED: "#b91c1c", RunStatus.DEFERRED: "#b45309", RunStatus.DROPPED: "#6b7280",
}  # fmt: skip
BADGE = '<span class="kj-status" style="background:{};color:#fff;border-radius:.6em;padding:0 .6em">{}</span>'
ERROR_SUMMARY = 120  # characters of the error shown in the list (the database cuts them)
RELATED_LIMIT = 20


def status_badge(run: JobRun) -> SafeString:
    return format_html(BADGE, STATUS_COLORS.get(run.status, "#6b7280"), run.get_status_display())


def format_duration(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def run_duration(run: JobRun) -> str:
    if run.started_at is None or run.finished_at is None:
        return "-"
    return format_duration(run.finished_at - run.started_at)


def error_summary(run: JobRun) -> str:
    """The first line of the error, from the ``error_head`` annotation of the list's query."""
    head = vars(run).get("error_head")
    if head is None:
        head = run.error if "error" in vars(run) else ""
    first = str(head or "").splitlines()[0] if head else ""
    return first if len(first) < ERROR_SUMMARY else first[: ERROR_SUMMARY - 1] + "…"


def runs_url(**filters: str) -> str:
    return f"{reverse('admin:kumiko_jobs_jobrun_changelist')}?{urlencode(filters)}"


def run_url(run_id: object) -> str:
    return reverse("admin:kumiko_jobs_jobrun_change", args=[str(run_id)])


def fanout_base(run: JobRun) -> str | None:
    """The job id a fan-out wrapper's children point at (fanout_parent), or None."""
    if wrapped_job(run.job_name) is None:
        return None
    return run.fanout_of or run.job_id


def list_links(run: JobRun) -> SafeString:
    """Small links of a list row, from its own fields."""
    links: list[tuple[str, str, str]] = []
    if run.retry_of:
        links.append((run_url(run.retry_of), "the failed run this one retries", "retry of"))
    base = fanout_base(run)
    if base:
        links.append((runs_url(fanout_parent=base), "the tenant runs this wrapper enqueued", "children"))
    if run.fanout_parent:
        links.append((runs_url(fanout_parent=run.fanout_parent), "the other runs of this fan-out", "fan-out"))
    return format_html_join(" ", '<a href="{}" title="{}">{}</a>', links)


def related_runs(run: JobRun) -> SafeString:
    """The detail page's block of related runs (operators)."""
    rows: list[tuple[str, SafeString]] = []
    if run.retry_of:
        rows.append(("Retry of", format_html('<a href="{}">{}</a>', run_url(run.retry_of), run.retry_of)))
    retries = list(
        JobRun.objects.filter(retry_of=run.pk).order_by("queued_at").values_list("pk", "status")[:5]
    )
    if retries:
        rows.append(
            (
                "Retried by",
                format_html_join(
                    ", ", '<a href="{}">{}</a> ({})', ((run_url(pk), pk, s) for pk, s in retries)
                ),
            )
        )
    base = fanout_base(run)
    if base:
        rows.append(("Fan-out children", format_html('<a href="{}">tenant runs of this wrapper</a>',
                                                     runs_url(fanout_parent=base))))  # fmt: skip
    if run.fanout_parent:
        wrapper = JobRun.objects.filter(job_id=run.fanout_parent).values_list("pk", flat=True).first()
        if wrapper:
            rows.append(("Fan-out wrapper", format_html('<a href="{}">{}</a>', run_url(wrapper), wrapper)))
        rows.append(("Fan-out siblings", format_html('<a href="{}">all tenant runs of this fan-out</a>',
                                                     runs_url(fanout_parent=run.fanout_parent))))  # fmt: skip
    if run.correlation_id:
        chain = runs_url(correlation_id=run.correlation_id)
        rows.append(
            ("Chain", format_html('<a href="{}">runs with correlation id {}</a>', chain, run.correlation_id))
        )
    if not rows:
        return format_html("{}", "-")
    return format_html(
        '<table class="kj-related">{}</table>', format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows)
    )
