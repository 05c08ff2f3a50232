"""Demo views: one that dispatches a job from a request (its trace and correlation id reach the
run), and the Prometheus scrape endpoint of the web process."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET, require_POST

from kumiko_jobs import dispatch
from project import telemetry
from project.demo.models import Tenant


@require_POST
def write_note(request: HttpRequest, slug: str) -> JsonResponse:
    """``POST /demo/<tenant slug>/notes/`` (``text``): dispatch ``demo.write_note`` for the tenant.

    Inside ``atomic()``, as a view that also writes its own rows would: the job reaches Redis
    when the transaction commits, and its send span is made then, under this request's span.
    """
    tenant = get_object_or_404(Tenant, slug=slug, active=True)
    text = request.POST.get("text", "hello")[:200]
    user = request.user if request.user.is_authenticated else None
    with transaction.atomic():
        result = dispatch("demo.write_note", {"text": text}, tenant=tenant, user=user)
    return JsonResponse(
        {"run_id": result.run_id, "job_id": result.job_id, "correlation_id": request.correlation_id},  # type: ignore[attr-defined]
        status=202,
    )


@require_GET
def prometheus_metrics(request: HttpRequest) -> HttpResponse:
    """This web process's metrics (queue depth included) for a Prometheus scrape. A deployment
    serves this on an internal port or behind authentication, not to the public."""
    body, content_type = telemetry.prometheus_text()
    return HttpResponse(body, content_type=content_type)
