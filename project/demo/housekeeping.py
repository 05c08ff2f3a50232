"""Make every demo start clean: forget a previous demo's runs, and provide an admin login."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from django.contrib.auth import get_user_model
from rq import Queue, Worker
from rq.serializers import JSONSerializer

from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.definitions import LANES
from kumiko_jobs.models import JobRun, TenantFailure

DEMO_JOB_PREFIX = "demo."
ADMIN_USERNAME = "admin"


@dataclass(frozen=True)
class Login:
    username: str
    password: str
    created: bool


def clear_previous_demo() -> tuple[int, int]:
    """Delete this prefix's Redis state and the demo's old run records.

    Returns (Redis keys deleted, run records deleted). Without this, a demo interrupted
    half-way would leave jobs that the next demo's workers run, and rows stuck in "queued".
    """
    client, keys = get_redis(), get_keys()
    # The whole namespace, not just the RQ queue lists: a lane also holds per-tenant flows,
    # retries waiting for their backoff, leases and counters, all of which name the prefix.
    names: set[bytes | str] = set()
    for lane in LANES:
        names.update((keys.queue(lane), keys.scheduled(lane), keys.started(lane)))
        names.update((keys.finished(lane), keys.failed(lane)))
    names.update(client.scan_iter(match=f"{_glob_escape(keys.prefix)}:*", count=1000))
    names.update(client.scan_iter(match=f"rq:job:{keys.id_tag}-*", count=1000))
    removed = int(client.delete(*names)) if names else 0
    deleted, _ = JobRun.objects.filter(job_name__startswith=DEMO_JOB_PREFIX).delete()
    TenantFailure.objects.filter(job_name__startswith=DEMO_JOB_PREFIX).delete()
    return removed, deleted


def running_workers() -> list[str]:
    """Names of live workers on this prefix's lanes (another demo, or a runjobs left running)."""
    client, keys = get_redis(), get_keys()
    return [
        f"{worker.name} (pid {worker.pid} on {worker.hostname})"
        for lane in LANES
        for worker in Worker.all(
            queue=Queue(keys.queue_name(lane), connection=client, serializer=JSONSerializer)
        )
    ]


def _glob_escape(text: str) -> str:
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def ensure_admin_login() -> Login:
    """An active superuser ``admin`` with a fresh random password (created or reset)."""
    password = secrets.token_urlsafe(12)
    user_model = get_user_model()
    user = user_model.objects.filter(username=ADMIN_USERNAME).first()
    if user is None:
        user_model.objects.create_superuser(ADMIN_USERNAME, "admin@example.com", password)
        return Login(ADMIN_USERNAME, password, created=True)
    user.is_active = user.is_staff = user.is_superuser = True
    user.set_password(password)
    user.save(update_fields=["is_active", "is_staff", "is_superuser", "password"])
    return Login(ADMIN_USERNAME, password, created=False)
