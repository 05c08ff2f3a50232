"""Retrying a failed run by hand (the admin's action, ``manage.py jobs``): a new run that points
at the one it retries, with the same job, tenant, payload and correlation id."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import router, transaction
from django.utils import timezone

from kumiko_jobs.conf import get_config
from kumiko_jobs.definitions import wrapped_job
from kumiko_jobs.dispatching import DispatchResult, submit
from kumiko_jobs.exceptions import NotRetryable
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.preparing import prepare
from kumiko_jobs.registry import registry
from kumiko_jobs.task_jobs import retry_placement
from kumiko_jobs.tenancy import user_id_of

RETRY_TRIGGER = "retry"


def retry_failed(run: JobRun, *, user: Any = None) -> DispatchResult:
    """Dispatch a failed run again. A fan-out wrapper's retry enqueues only the tenants its
    original did not reach (their children's ids derive from the original's); a failed child
    is retried on its own, for its tenant.

    Raises NotRetryable for a run that did not fail, UnknownJob if the job is gone.
    """
    if run.status != RunStatus.FAILED:
        raise NotRetryable(f"Run {run.pk} of {run.job_name!r} is {run.status}; only failed runs are retried.")
    using = router.db_for_write(JobRun)
    with transaction.atomic(using=using):
        # The original's row is locked while its retry is recorded: two operators (or a double
        # click) cannot both retry it, and a retried run is not retried again (the job would run
        # twice). The retry reaches Redis when this commits.
        JobRun.objects.using(using).select_for_update().filter(pk=run.pk).values_list("pk").first()
        earlier = JobRun.objects.using(using).filter(retry_of=run.pk).values_list("pk", flat=True).first()
        if earlier is not None:
            raise NotRetryable(
                f"Run {run.pk} of {run.job_name!r} was retried already, by run {earlier}; retry that "
                "run if it failed too."
            )
        if wrapped_job(run.job_name):
            _check_fan_out_chain(run, using)
        return _dispatch_retry(run, user)


def _check_fan_out_chain(run: JobRun, using: str) -> None:
    """A wrapper's retry skips the tenants its chain reached by finding their children's rows,
    whose ids derive from the chain's first run (or its cron tick). Once retention may have
    pruned them (that first run was queued longer than RUN_RETENTION ago, or its row is gone),
    those tenants would be queued a second time: refused, with what to do instead."""
    first: JobRun | None = run
    for _ in range(MAX_CHAIN):
        if first is None or first.retry_of is None:
            break
        first = JobRun.objects.using(using).only("queued_at", "retry_of").filter(pk=first.retry_of).first()
    retention = float(get_config()["RUN_RETENTION"])
    if first is None or first.queued_at < timezone.now() - timedelta(seconds=retention):
        raise NotRetryable(
            f"Run {run.pk} of {run.job_name!r} fans out again for the tenants its first run "
            f"{'(pruned already) ' if first is None else ''}did not reach, and that run was queued "
            f"longer ago than KUMIKO_JOBS['RUN_RETENTION'] ({retention:g}s): the tenants it reached "
            "may have lost the records that tell, and would run twice. Dispatch the job anew "
            "instead (every tenant runs once)."
        )


# Retries of retries followed back to the first run, at most (each is an operator's click).
MAX_CHAIN = 100


def _dispatch_retry(run: JobRun, user: Any) -> DispatchResult:
    target = wrapped_job(run.job_name)
    definition = registry.get(target or run.job_name)
    payload, now = run.payload, timezone.now()
    if definition.task is not None:
        # A Django task's run keeps the lane and priority .using() gave it.
        definition, payload = retry_placement(definition, run.lane, run.payload, now)
    prepared = prepare(
        definition,
        payload,
        tenant_id=run.tenant_id,
        user_id=user_id_of(user),
        correlation_id=run.correlation_id or None,
        trigger_name=RETRY_TRIGGER,
        retry_of=run.pk,
        fanout_of=(run.fanout_of or run.job_id) if target else "",
        # A retried cron run keeps its tick; a tz="tenant" zone wrapper its zone's tenants.
        scheduled_at=run.scheduled_at.timestamp() if run.scheduled_at else None,
        zone=run.zone,
        now=now,
    )
    return submit([prepared])[0]
