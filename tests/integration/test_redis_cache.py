"""``KUMIKO_JOBS["REDIS"] = "cache:default"``: dispatch, a real worker and django-rq's dashboard
all use the django-redis cache's connection pool (one Redis configuration for the project)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.test import Client
from django_redis import get_redis_connection
from django_rq.connection_utils import get_connection

from kumiko_jobs import dispatch
from kumiko_jobs.conf import redis_url
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.dashboard.queue import LaneQueue
from kumiko_jobs.models import JobRun, RunStatus

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def cache_url(settings: Any, kumiko_prefix: str) -> Iterator[str]:
    """The test Redis at database 3: a worker that ignored the cache setting (and used the URL's
    database 0) would find no job there. Its keys are deleted afterwards."""
    url = urlunsplit(urlsplit(redis_url())._replace(path="/3"))
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 5, "SOCKET_TIMEOUT": 5},
        }
    }
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "REDIS_URL": None, "REDIS": "cache:default"}
    yield url
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"*{kumiko_prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def test_dispatch_worker_and_dashboard_share_the_cache_pool(
    cache_url: str, start_worker: Any, admin_client: Client
) -> None:
    pool = get_redis_connection("default").connection_pool
    assert get_redis().connection_pool is pool
    assert LaneQueue(get_keys().queue_name("worker")).connection.connection_pool is pool
    assert get_connection(get_keys().queue_name("worker")).connection_pool is pool  # django-rq's own

    result = dispatch("tests.record", {"n": 1})
    assert redis.Redis.from_url(cache_url).exists(get_keys().job(str(result.job_id)))
    page = admin_client.get("/django-rq/")
    assert {q["name"]: q["jobs"] for q in page.context["queues"]}[get_keys().queue_name("worker")] == 1

    worker = start_worker("worker", "--burst", env={"KUMIKO_TEST_REDIS_CACHE": cache_url}, wait=False)
    assert worker.wait(60) == 0, worker.output()
    assert JobRun.objects.get(pk=result.run_id).status == RunStatus.SUCCEEDED, worker.output()
