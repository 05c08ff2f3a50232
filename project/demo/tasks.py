"""A Django ``@task`` of the demo: plain Django, run by kumiko_jobs (settings.TASKS).

The demo enqueues it inside each tenant (``tenant_context``, as a request middleware would), so
its runs get the tenant, its fairness, the run browser and retries like the demo's ``@job``s.
"""

from __future__ import annotations

from django.tasks import task

from kumiko_jobs.tenancy import current_tenant_id
from project.demo.models import Note


@task(priority=10)
def count_notes(label: str) -> dict[str, object]:
    """Counts the run's tenant's notes: the scoped manager needs no tenant, kumiko activated it."""
    return {"label": label, "tenant": current_tenant_id(), "notes": Note.objects.count()}
