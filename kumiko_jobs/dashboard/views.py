"""django-rq's dashboard views, with the writes on kumiko lanes done through kumiko's API.

For a queue that is a kumiko lane, "delete" cancels waiting jobs (``cancelling``), "requeue"
puts runs back in their flows with their limits (``requeueing``), "empty queue" cancels every
waiting job and "stop" is refused (a lane job runs inside its worker process; use a timeout).
Deleting a running job is refused too: its worker still releases its limits and cap slot,
and without its started-registry entry a crash of that worker would go unnoticed. Everything
else, and every other queue, is django-rq's own view. The dashboard page skips django-rq's
registry maintenance on lanes: RQ's started-registry cleanup would fail a dead worker's run
behind kumiko's reaper (no retry, no record, limits never released).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC
from importlib.util import find_spec
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django_rq import stats_views
from django_rq import views as rq_views
from django_rq.queues import get_queue_by_index
from django_rq.settings import get_queues_list
from django_rq.utils import get_cron_schedulers, get_scheduler_statistics, get_statistics
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.registry import FailedJobRegistry, clean_registries
from rq.utils import as_text, utcparse
from rq.worker_registration import clean_worker_registry

from kumiko_jobs import records
from kumiko_jobs.cancelling import cancel_queued
from kumiko_jobs.dashboard.queue import LaneQueue, lane_of
from kumiko_jobs.requeueing import requeue_jobs

WAITING = ("queued", "scheduled")
DONE = ("finished", "failed", "canceled", "stopped")
NOT_A_LANE_JOB = "not a kumiko job: use its own queue's page"


@never_cache
def stats(request: HttpRequest) -> HttpResponse:
    """django-rq's front page: its statistics, without RQ's registry cleanup on lanes."""
    for index in range(len(get_queues_list())):
        queue = get_queue_by_index(index)
        clean_worker_registry(queue)
        if lane_of(queue.name) is None:
            clean_registries(queue)
    statistics = get_statistics(run_maintenance_tasks=False)
    for data in statistics["queues"]:
        if lane_of(data["name"]) is not None:
            oldest = LaneQueue(data["name"]).oldest_enqueued_at()
            if oldest:
                stamp = timezone.localtime(utcparse(oldest).replace(tzinfo=UTC))
                data["oldest_job_timestamp"] = stamp.strftime("%Y-%m-%d, %H:%M:%S")
    context = {
        **rq_views.each_context(request),
        **statistics,
        **get_scheduler_statistics(),
        "view_metrics": find_spec("prometheus_client") is not None,
        "cron_schedulers": get_cron_schedulers(),
    }
    return render(request, "django_rq/stats.html", context)


def _lane_job_ids(queue: Any, job_ids: Sequence[str]) -> list[str]:
    """The jobs that are a kumiko lane's: all of them under a lane's URL, else those whose own
    origin is a lane (one round trip; a lane job reached through another queue's URL must not
    be deleted or requeued by RQ, behind its limits, its flow and its run record)."""
    if lane_of(queue.name) is not None:
        return list(job_ids)
    pipe = queue.connection.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hget(Job.key_for(job_id), "origin")
    origins = pipe.execute()
    return [
        job_id
        for job_id, origin in zip(job_ids, origins, strict=True)
        if origin is not None and lane_of(as_text(origin)) is not None
    ]


def _is_lane_job(queue: Any, job_id: str) -> bool:
    return bool(_lane_job_ids(queue, [job_id]))


@never_cache
def delete_job(request: HttpRequest, queue_index: int, job_id: str) -> HttpResponse:
    queue = get_queue_by_index(queue_index)
    if request.method != "POST" or not _is_lane_job(queue, job_id):
        return rq_views.delete_job(request, queue_index, job_id)
    _delete(request, queue, [job_id])
    return redirect(rq_views.rq_viewname(request, "jobs"), queue_index)


@never_cache
def requeue_job(request: HttpRequest, queue_index: int, job_id: str) -> HttpResponse:
    return _requeue_one(request, queue_index, job_id, rq_views.requeue_job_view)


@never_cache
def enqueue_job(request: HttpRequest, queue_index: int, job_id: str) -> HttpResponse:
    # django-rq's "enqueue" (of a scheduled or deferred job) is a requeue for a lane job.
    return _requeue_one(request, queue_index, job_id, rq_views.enqueue_job)


def _requeue_one(
    request: HttpRequest, queue_index: int, job_id: str, rq_view: Callable[..., HttpResponse]
) -> HttpResponse:
    queue = get_queue_by_index(queue_index)
    if request.method != "POST" or not _is_lane_job(queue, job_id):
        return rq_view(request, queue_index, job_id)
    _requeue(request, [job_id])
    return redirect(rq_views.rq_viewname(request, "job_detail"), queue_index, job_id)


@never_cache
def requeue_all(request: HttpRequest, queue_index: int) -> HttpResponse:
    queue = get_queue_by_index(queue_index)
    if request.method != "POST" or lane_of(queue.name) is None:
        return rq_views.requeue_all(request, queue_index)
    _requeue(request, FailedJobRegistry(queue.name, queue.connection).get_job_ids())
    return redirect(rq_views.rq_viewname(request, "jobs"), queue_index)


@never_cache
def clear_queue(request: HttpRequest, queue_index: int) -> HttpResponse:
    queue = get_queue_by_index(queue_index)
    if request.method != "POST" or lane_of(queue.name) is None:
        return rq_views.clear_queue(request, queue_index)
    _delete(request, queue, LaneQueue(queue.name).get_job_ids())
    return redirect(rq_views.rq_viewname(request, "jobs"), queue_index)


@never_cache
def actions(request: HttpRequest, queue_index: int) -> HttpResponse:
    queue = get_queue_by_index(queue_index)
    action = request.POST.get("action", "")
    if request.method != "POST" or action not in ("delete", "requeue", "stop"):
        return rq_views.actions(request, queue_index)
    selected = request.POST.getlist("job_ids")
    job_ids = _lane_job_ids(queue, selected)
    if not job_ids:
        return rq_views.actions(request, queue_index)
    next_url = request.POST.get("next_url", "")
    if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()}):
        next_url = reverse(rq_views.rq_viewname(request, "jobs"), args=[queue_index])
    # Lane jobs picked on another queue's page: kumiko acts on them, and on none of the rest
    # (RQ's view would act on all of them, the lane jobs too).
    lane_jobs = set(job_ids)
    others = [job_id for job_id in selected if job_id not in lane_jobs]
    if others:
        _report_refused(request, action, dict.fromkeys(others, NOT_A_LANE_JOB))
    if action == "delete":
        _delete(request, queue, job_ids)
    elif action == "requeue":
        _requeue(request, job_ids)
    else:
        _refuse_stop(request)
    return redirect(next_url)


@never_cache
def stop_job(request: HttpRequest, queue_index: int, job_id: str) -> HttpResponse:
    queue = get_queue_by_index(queue_index)
    if not _is_lane_job(queue, job_id):
        return rq_views.stop_job(request, queue_index, job_id)
    _refuse_stop(request)
    return redirect(rq_views.rq_viewname(request, "job_detail"), queue_index, job_id)


# django-rq's view -> ours, for the URL patterns (urls.py and the admin's dashboard).
OVERRIDES: dict[Any, Any] = {
    stats_views.stats: stats,
    rq_views.delete_job: delete_job,
    rq_views.requeue_job_view: requeue_job,
    rq_views.enqueue_job: enqueue_job,
    rq_views.requeue_all: requeue_all,
    rq_views.clear_queue: clear_queue,
    rq_views.actions: actions,
    rq_views.stop_job: stop_job,
}


def _delete(request: HttpRequest, queue: Any, job_ids: Sequence[str]) -> None:
    pipe = queue.connection.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hget(Job.key_for(job_id), "status")
    statuses = {
        job_id: as_text(raw) if raw else None for job_id, raw in zip(job_ids, pipe.execute(), strict=True)
    }
    result = cancel_queued([job_id for job_id, status in statuses.items() if status in WAITING])
    refused = dict(result.refused)
    # Canceled runs whose rows could not be written keep their hash, so repair can drop them;
    # so does a finished job whose record is not finished yet (its write was lost): without the
    # hash, repair would push the run again from its record, and a canceled run would run.
    done = [job_id for job_id, status in statuses.items() if status in DONE]
    unsettled = records.unfinished_job_ids(done)
    for job_id in unsettled:
        refused[job_id] = "its run record does not say it ended yet; repair settles it within minutes"
    deletable = [
        *(result.canceled if result.recorded else ()),
        *(job_id for job_id in done if job_id not in unsettled),
    ]
    for job_id, status in statuses.items():
        if status is None:
            refused[job_id] = "no such job"
        elif status not in WAITING and status not in DONE:
            refused[job_id] = f"it is {status}" + (": a worker runs it" if status == "started" else "")
    deleted = 0
    for job_id in deletable:
        try:
            Job.fetch(job_id, connection=queue.connection, serializer=queue.serializer).delete()
            deleted += 1
        except NoSuchJobError:
            continue
    if deleted:
        messages.info(request, f"Deleted {deleted} job{'s' if deleted != 1 else ''}.")
    if result.canceled and not result.recorded:
        messages.warning(
            request, f"Canceled {len(result.canceled)} job(s); their run records are repaired within minutes."
        )
    _report_refused(request, "delete", refused)


def _requeue(request: HttpRequest, job_ids: Sequence[str]) -> None:
    result = requeue_jobs(job_ids)
    if result.requeued:
        count = len(result.requeued)
        messages.info(request, f"Requeued {count} job{'s' if count != 1 else ''}.")
    _report_refused(request, "requeue", result.refused)


def _report_refused(request: HttpRequest, what: str, refused: dict[str, str]) -> None:
    if refused:
        shown = "; ".join(f"{job_id} ({why})" for job_id, why in list(refused.items())[:10])
        more = f" and {len(refused) - 10} more" if len(refused) > 10 else ""
        messages.warning(request, f"Did not {what} {len(refused)} job(s): {shown}{more}.")


def _refuse_stop(request: HttpRequest) -> None:
    messages.error(
        request,
        "kumiko_jobs runs a lane's jobs inside the worker process, so one job cannot be stopped alone: "
        "give the job a timeout, or stop its worker (SIGTERM) and it is retried.",
    )
