"""The run browser's bulk actions, each through the library's API: retry failed runs
(``retrying.retry_failed``) and cancel waiting ones (``cancelling.cancel_queued``).

Actions run on the admin's queryset, so nobody acts on a run they cannot see, and both are for
operators only (``has_retry_permission`` / ``has_cancel_permission`` of the ModelAdmin).
"""

from __future__ import annotations

from typing import Any

import redis
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from kumiko_jobs.cancelling import cancel_queued
from kumiko_jobs.exceptions import KumikoJobsError, QueueUnavailable
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.retrying import retry_failed

# Each retry dispatches a job; a "select all" over millions must not.
ACTION_LIMIT = 100
# Run states of a job Redis holds as queued or scheduled (a retry or a deferral waits scheduled).
WAITING = (RunStatus.QUEUED, RunStatus.DEFERRED)


def _selected(
    model_admin: Any, request: HttpRequest, queryset: QuerySet[JobRun], fields: tuple[str, ...]
) -> list[JobRun] | None:
    runs = list(queryset.only(*fields)[: ACTION_LIMIT + 1])
    if len(runs) > ACTION_LIMIT:
        model_admin.message_user(request, f"Select at most {ACTION_LIMIT} runs at once.", messages.ERROR)
        return None
    return runs


@admin.action(description="Retry selected failed runs", permissions=["retry"])
def retry_failed_runs(model_admin: Any, request: HttpRequest, queryset: QuerySet[JobRun]) -> None:
    # Every field retry_failed reads: a deferred one is a query per run.
    fields = (
        "id", "job_name", "tenant_id", "status", "payload", "correlation_id", "job_id", "fanout_of",
        "scheduled_at", "zone", "lane", "queued_at", "retry_of",
    )  # fmt: skip
    runs = _selected(model_admin, request, queryset, fields)
    if runs is None:
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
            model_admin.message_user(
                request, f"Re-dispatched {retried} failed runs, then stopped: {exc}", messages.ERROR
            )
            return
        except KumikoJobsError as exc:  # job no longer declared, tenant deleted, ...
            skipped.append(f"{run.job_name} {run.pk} ({exc})")
            continue
        if result.status == "queued":
            retried += 1
        else:
            skipped.append(f"{run.job_name} {run.pk} (not queued: {result.reason})")
    model_admin.message_user(
        request, f"Re-dispatched {retried} failed runs.", messages.SUCCESS if retried else messages.INFO
    )
    if skipped:
        model_admin.message_user(request, f"Skipped {len(skipped)}: {'; '.join(skipped)}.", messages.WARNING)


@admin.action(description="Cancel selected queued runs", permissions=["cancel"])
def cancel_queued_runs(model_admin: Any, request: HttpRequest, queryset: QuerySet[JobRun]) -> None:
    runs = _selected(model_admin, request, queryset, ("id", "job_id", "job_name", "status"))
    if runs is None:
        return
    waiting = [run for run in runs if run.status in WAITING]
    skipped = [f"{run.job_name} {run.pk} ({run.status})" for run in runs if run.status not in WAITING]
    try:
        result = cancel_queued(
            [run.job_id for run in waiting], reason=f"Canceled by {request.user} in the admin."
        )
    except (QueueUnavailable, redis.RedisError) as exc:
        model_admin.message_user(request, f"Nothing was canceled: {exc}", messages.ERROR)
        return
    names = {run.job_id: f"{run.job_name} {run.pk}" for run in waiting}
    skipped += [f"{names[job_id]} ({why})" for job_id, why in result.refused.items()]
    model_admin.message_user(
        request,
        f"Canceled {len(result.canceled)} queued runs.",
        messages.SUCCESS if result.canceled else messages.INFO,
    )
    if skipped:
        model_admin.message_user(
            request, f"Not canceled {len(skipped)}: {'; '.join(skipped)}.", messages.WARNING
        )
    if not result.recorded:
        model_admin.message_user(
            request,
            "Redis canceled them, but their run records could not be updated; see the log.",
            messages.ERROR,
        )
