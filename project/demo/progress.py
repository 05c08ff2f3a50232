"""Watch the demo's runs through their records, and summarise them per tenant with rich."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence

from django.db.models import Count
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kumiko_jobs.models import JobRun, RunStatus
from project.demo.models import Tenant

POLL_SECONDS = 0.25
FINAL_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.DROPPED)
TABLE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SUCCEEDED, RunStatus.FAILED)


class UnfinishedRunsError(Exception):
    """Some runs were not final when the time ran out."""


def fetch_records(run_ids: Sequence[str]) -> dict[str, JobRun]:
    return {str(run.pk): run for run in JobRun.objects.filter(pk__in=run_ids)}


def count_statuses(run_ids: Sequence[str]) -> Counter[str]:
    # One small GROUP BY per poll: the rows themselves (logs, payloads) are read only at the end.
    rows = JobRun.objects.filter(pk__in=run_ids).order_by().values_list("status").annotate(n=Count("pk"))
    return Counter(dict(rows))


def progress_bars(console: Console) -> Progress:
    """One bar for dispatching, one for finished runs (each task has a ``label`` field)."""
    return Progress(
        TextColumn("[bold]{task.fields[label]:<10}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
    )  # fmt: skip


def wait_until_final(
    bars: Progress, run_ids: Sequence[str], timeout: float, check_alive: Callable[[], None]
) -> dict[str, JobRun]:
    """Poll the run records until every run is final (succeeded or failed), advancing a bar.

    ``check_alive`` raises if a worker died, so a broken worker fails the demo at once
    instead of after the whole timeout. Raises UnfinishedRunsError with the unfinished counts.
    """
    task = bars.add_task("", total=len(run_ids), label="finished")
    deadline = time.monotonic() + timeout
    while True:
        statuses = count_statuses(run_ids)
        done = sum(statuses[status] for status in FINAL_STATUSES)
        summary = _describe(statuses, len(run_ids) - statuses.total())
        bars.update(task, completed=done, description=summary)
        if done == len(run_ids):
            return fetch_records(run_ids)
        if time.monotonic() > deadline:
            raise UnfinishedRunsError(summary)
        check_alive()
        time.sleep(POLL_SECONDS)


def _describe(statuses: Counter[str], unrecorded: int) -> str:
    parts = [f"{statuses[status]} {status}" for status in RunStatus if statuses[status]]
    if unrecorded:
        # dispatch() logs, not raises, a failed record insert: such runs would never show up.
        parts.append(f"{unrecorded} not recorded yet")
    return ", ".join(parts)


def runs_per_tenant(tenants: Sequence[Tenant], records: dict[str, JobRun], title: str) -> Table:
    """Rows: tenants; columns: run counts by status, plus the total (every status)."""
    table = Table(title=title, show_footer=True)
    table.add_column("tenant", footer="all tenants")
    counts = {str(tenant.pk): Counter[str]() for tenant in tenants}
    for run in records.values():
        if run.tenant_id in counts:
            counts[run.tenant_id][run.status] += 1
    columns: tuple[str, ...] = (*TABLE_STATUSES, "total")
    totals = {column: _cell(counts, column) for column in columns}
    for column in columns:
        table.add_column(column, justify="right", footer=str(sum(totals[column].values())))
    for tenant in tenants:
        key = str(tenant.pk)
        table.add_row(tenant.name, *(str(totals[column][key]) for column in columns))
    return table


def _cell(counts: dict[str, Counter[str]], column: str) -> dict[str, int]:
    if column == "total":
        return {key: counter.total() for key, counter in counts.items()}
    return {key: counter[column] for key, counter in counts.items()}
