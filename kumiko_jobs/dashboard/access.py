"""Who may use django-rq's dashboard: operators only.

The dashboard shows every tenant's jobs with their payloads and error text, and can delete
them, so django-rq's own rule (any ``is_staff`` user) would let one tenant's staff read and
delete another tenant's work. Operators are active staff that are superusers or hold the
permission ``kumiko_jobs.use_rq_dashboard`` (grant it in the admin, to a user or a group).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from secrets import compare_digest
from typing import Any

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse

from kumiko_jobs.conf import import_setting

PERMISSION = "kumiko_jobs.use_rq_dashboard"
# Set on every view this package wraps; check kumiko_jobs.W111 looks for django-rq views without it.
MARKER = "kumiko_operator_only"

View = Callable[..., HttpResponse]


def is_dashboard_operator(user: Any) -> bool:
    """Superusers, and staff with the dashboard permission who are not a tenant's staff (the
    dashboard shows every tenant's jobs and payloads; README: tenant staff never see it)."""
    if not (getattr(user, "is_active", False) and getattr(user, "is_staff", False)):
        return False
    if getattr(user, "is_superuser", False):
        return True
    if not user.has_perm(PERMISSION):
        return False
    hook = import_setting("USER_TENANT")
    return hook is None or hook(user) is None


def operator_only(view: View) -> View:
    """Staff who are not operators get 403; anonymous users go to the admin login."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not is_dashboard_operator(request.user):
            raise PermissionDenied("The jobs dashboard is for operators (kumiko_jobs.use_rq_dashboard).")
        return view(request, *args, **kwargs)

    setattr(wrapper, MARKER, True)
    # The login redirect first, as django-rq's views do it, then the operator check.
    guarded: View = staff_member_required(wrapper)
    setattr(guarded, MARKER, True)
    return guarded


def operator_or_token(view: View) -> View:
    """For django-rq's JSON and metrics endpoints: an operator's session, or the bearer token
    ``RQ_API_TOKEN`` (django-rq alone also lets any staff session in)."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if is_dashboard_operator(request.user) or _valid_token(request, kwargs.get("token")):
            return view(request, *args, **kwargs)
        return JsonResponse(
            {
                "error": True,
                "description": "Operators only: log in as one, or send the RQ_API_TOKEN bearer token.",
            },
            status=401 if not request.user.is_authenticated else 403,
        )

    setattr(wrapper, MARKER, True)
    return wrapper


def _valid_token(request: HttpRequest, url_token: str | None) -> bool:
    expected = str(getattr(settings, "RQ_API_TOKEN", "") or "")
    if not expected:
        return False
    header = request.headers.get("Authorization", "")
    sent = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else (url_token or "")
    return bool(sent) and compare_digest(expected, sent)
