"""A tenant's own "recent jobs and problems" page: the pattern a SaaS copies into its UI.

It reads only ``tenant_runs()`` and ``tenant_failures()``, which hold no payload, error text or
log line, and turns message keys into the tenant's words. Access: the tenant's members, and
operators (superusers) for any tenant.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from kumiko_jobs import tenant_failures, tenant_runs
from kumiko_jobs.tenant_history import parse_subject
from project.demo.models import Tenant
from project.demo.tenants import tenant_of_user

SHOWN = 50
# What the tenant reads for each job and message key (a real project would use gettext).
JOB_LABELS = {"demo.flaky_sync": "Partner sync", "demo.always_fails": "Invoice export"}
MESSAGES = {
    "demo.export_failed": "The export could not be produced. Our team has been told; no action needed."
}
UNKNOWN_KEY = "Something went wrong; our team has been told."
STATUS_LABELS = {
    "queued": "Waiting", "running": "Running", "succeeded": "Done", "failed": "Failed", "deferred": "Waiting",
}  # fmt: skip


@login_required
def tenant_jobs(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = get_object_or_404(Tenant, slug=slug)
    user: Any = request.user
    if not user.is_superuser and tenant_of_user(user) != tenant.pk:
        raise Http404("No such tenant.")  # not 403: the page does not say which tenants exist
    runs = [
        {**run, "label": JOB_LABELS.get(run["job_name"], run["job_name"]), "about": _about(run["subject"]),
         "state": STATUS_LABELS.get(run["status"], run["status"])}
        for run in tenant_runs(tenant)[:SHOWN]
    ]  # fmt: skip
    problems = [
        {**failure, "label": JOB_LABELS.get(failure["job_name"], failure["job_name"]),
         "about": _about(failure["subject"]), "text": MESSAGES.get(failure["message_key"], UNKNOWN_KEY)}
        for failure in tenant_failures(tenant)[:SHOWN]
    ]  # fmt: skip
    return render(request, "demo/tenant_jobs.html", {"tenant": tenant, "runs": runs, "problems": problems})


def _about(subject: str | None) -> str:
    values = parse_subject(subject) or {}
    return ", ".join(f"#{value}" if name == "seq" else f"{name} {value}" for name, value in values.items())
