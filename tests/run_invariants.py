"""The run table's rules, checked on the rows each test leaves.

The table has no CHECK constraints (models.JobRun.Meta: PostgreSQL rebuilds them for every
INSERT and UPDATE), so the suite checks the seven rules they held instead: a valid status,
``attempt >= 1``, non-negative counters, a finish time on finished runs. tests/conftest.py does
it after each pytest test's fixtures are torn down (the workers a test started have stopped
and written their last outcomes) and before its database is rolled back or flushed;
``CheckedRunRows`` does it for Django's TestCases, which flush in their own teardown. A row
that broke a rule and was mended or deleted within the test is not seen: a CHECK would have
refused its write.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from kumiko_jobs.models import FINISHED_STATUSES, JobRun, RunStatus

_FIELDS = ("job_id", "status", "attempt", "max_attempts", "defer_count", "fanout_count", "finished_at")


def runs_breaking_the_rules() -> list[tuple[Any, ...]]:
    """Up to five run rows that break one of the rules (empty when all keep them)."""
    broken = (
        ~Q(status__in=RunStatus.values)
        | Q(attempt__lt=1)
        | Q(max_attempts__lt=0)
        | Q(defer_count__lt=0)
        | Q(fanout_count__lt=0)
        | Q(status__in=FINISHED_STATUSES, finished_at__isnull=True)
    )
    return list(JobRun.objects.filter(broken).values_list(*_FIELDS)[:5])


class CheckedRunRows:
    """A Django TestCase mixin: the run rows the test leaves keep the rules (read in tearDown,
    before the TestCase's own flush or rollback)."""

    def tearDown(self) -> None:
        super().tearDown()  # type: ignore[misc]
        broken = runs_breaking_the_rules()
        assert not broken, f"run rows break the run table's rules: {broken}"
