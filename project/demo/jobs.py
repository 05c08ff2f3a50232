"""Example jobs of the demo, one per kind of outcome the run browser shows.

Handlers run inside their tenant's django-scopes scope (kumiko_jobs activates it), so they
use ``Note.objects`` without naming the tenant in queries; the payload never carries it.
"""

from __future__ import annotations

from typing import Any

from kumiko_jobs import Backoff, TenantVisibleFailure, TenantVisibleRun, UnrecoverableError, job, on_event
from kumiko_jobs.context import JobContext
from project.demo.models import Note

FLAKY_SUCCEEDS_ON = 3


def tenant_of(ctx: JobContext) -> str:
    if ctx.tenant_id is None:
        # Retrying cannot conjure up a tenant: fail at once with what to change.
        raise UnrecoverableError(
            f"{ctx.job_name} writes tenant data: dispatch it with tenant=<Tenant or id>."
        )
    return ctx.tenant_id


@job("demo.write_note")
def write_note(payload: dict[str, Any], ctx: JobContext) -> None:
    """Quick job: store one note for the run's tenant."""
    note = Note.objects.create(tenant_id=tenant_of(ctx), text=str(payload.get("text", "hello")))
    ctx.log.info("wrote note %s for tenant %s", note.pk, ctx.tenant_id)


# The tenant sees these runs on its own "recent jobs and problems" page (project/demo/tenant_views.py):
# status and times per sync, never the payload or the error text.
SYNC_SEEN_BY_TENANT = TenantVisibleRun(subject_fields=("seq",))


@job(
    "demo.flaky_sync",
    retries=2,
    backoff=Backoff("fixed", delay_ms=200),
    tenant_visible_run=SYNC_SEEN_BY_TENANT,
)
def flaky_sync(payload: dict[str, Any], ctx: JobContext) -> None:
    """Fails on attempts 1 and 2, succeeds on 3: shows retries with a fixed backoff."""
    # Decided by the attempt number, which travels with the job: any worker process, or a
    # restarted one, takes the same decision.
    if ctx.attempt < FLAKY_SUCCEEDS_ON:
        raise ConnectionError(f"partner API timed out (attempt {ctx.attempt} of {FLAKY_SUCCEEDS_ON})")
    ctx.log.info("synced on attempt %s", ctx.attempt)


@job(
    "demo.always_fails",
    retries=1,
    tenant_visible_run=TenantVisibleRun(subject_fields=("seq",)),
    # A final failure leaves the tenant a message key (translated by its UI), cleared by a
    # later success of the same export.
    tenant_visible_failure=TenantVisibleFailure("demo.export_failed", subject_fields=("seq",)),
)
def always_fails(payload: dict[str, Any], ctx: JobContext) -> None:
    """Fails on every attempt: ends ``failed`` after one retry, error kept on the run."""
    ctx.log.warning("about to fail (attempt %s)", ctx.attempt)
    raise ValueError("the export template is missing (this demo job always fails)")


@job("demo.preview", lane="api")
def preview(payload: dict[str, Any], ctx: JobContext) -> None:
    """Runs on the latency-sensitive ``api`` lane, served by its own worker."""
    count = Note.objects.count()
    ctx.log.info("preview for tenant %s: %s notes so far", ctx.tenant_id, count)


@job("demo.index_note", trigger=on_event("note.created"))
def index_note(payload: dict[str, Any], ctx: JobContext) -> None:
    """Triggered by ``emit("note.created", {"note_id": ...}, tenant=...)``."""
    # The scope hides other tenants' notes, so a note id from the wrong tenant is not found.
    note = Note.objects.get(pk=payload["note_id"])
    ctx.log.info("indexed note %s: %r", note.pk, note.text)
