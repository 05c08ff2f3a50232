"""The run browser's queries, kept bounded on a table of millions of rows."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db.models import Max, Min, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.functional import cached_property

from kumiko_jobs.admin.access import tenant_names
from kumiko_jobs.models import JobRun


class CappedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Counts at most ``COUNT_CAP`` rows, since ``COUNT(*)`` over millions of runs costs more
    than the page itself. Beyond the cap the list says "10000+"; filters narrow it down."""

    COUNT_CAP = 10_000

    @cached_property
    def _bounded_count(self) -> int:
        # COUNT over a LIMITed subquery reads at most COUNT_CAP + 1 index entries.
        runs = cast("QuerySet[JobRun]", self.object_list)
        return runs.order_by()[: self.COUNT_CAP + 1].count()

    @cached_property
    def count(self) -> int:
        return min(self._bounded_count, self.COUNT_CAP)

    @property
    def capped(self) -> bool:
        return self._bounded_count > self.COUNT_CAP


class RunQuerySet(QuerySet[JobRun]):
    """The admin's queryset. Django's date hierarchy asks for the distinct years, months or
    days that have runs, which scans every row in range; listing each period between the
    first and the last run costs two index lookups instead (a day without runs may show)."""

    def datetimes(  # type: ignore[override]
        self, field_name: str, kind: str, order: str = "ASC", tzinfo: Any = None
    ) -> list[datetime]:
        if kind not in ("year", "month", "day"):
            return list(super().datetimes(field_name, kind, order, tzinfo))  # type: ignore[arg-type]
        bounds = self.aggregate(first=Min(field_name), last=Max(field_name))
        if bounds["first"] is None:
            return []
        first, last = (timezone.localtime(bounds[key], tzinfo) for key in ("first", "last"))
        period = first.replace(
            month=1 if kind == "year" else first.month, day=first.day if kind == "day" else 1,
            hour=0, minute=0, second=0, microsecond=0,
        )  # fmt: skip
        periods = []
        while period <= last:
            periods.append(period)
            period = _next_period(period, kind)
        return periods if order == "ASC" else periods[::-1]


def _next_period(period: datetime, kind: str) -> datetime:
    if kind == "year":
        return period.replace(year=period.year + 1)
    if kind == "month":
        return period.replace(year=period.year + period.month // 12, month=period.month % 12 + 1)
    # Add the day in local wall time, so a DST change does not shift midnight.
    return timezone.make_aware(period.replace(tzinfo=None) + timedelta(days=1), period.tzinfo)


class RunChangeList(ChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[JobRun]:
        # The list shows none of the large columns; the detail page and actions load them.
        queryset: QuerySet[JobRun] = super().get_queryset(request, exclude_parameters)
        rows: QuerySet[JobRun] = queryset.defer("payload", "logs", "error", "traceback")
        # The admin may add columns of its own (the error summary of operators' lists).
        list_rows = getattr(self.model_admin, "list_rows", None)
        return list_rows(request, rows) if list_rows is not None else rows

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        # The page's tenant names in one query. Iterating result_list fills its queryset
        # cache, which the template then reuses.
        names = tenant_names(run.tenant_id for run in self.result_list)
        for run in self.result_list:
            vars(run)["tenant_name"] = names.get(run.tenant_id or "")
