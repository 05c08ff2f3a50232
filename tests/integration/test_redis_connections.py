"""End to end on private Redis servers: a password, TLS (rediss://) and a Sentinel URL, each used
by dispatch, a real ``runjobs`` worker and django-rq's dashboard. The servers are this module's
own (free ports) and are stopped when it ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.test import Client

from kumiko_jobs import dispatch
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.exceptions import QueueUnavailable
from kumiko_jobs.models import JobRun, RunStatus
from tests.integration.redis_servers import RedisServer, free_port, make_tls_files

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def password_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    server = RedisServer(tmp_path_factory.mktemp("redis-pw"), f"port {port}\nrequirepass s3cret\n")
    try:
        server.wait_ready(redis.Redis(host="127.0.0.1", port=port, password="s3cret"))
        yield f"redis://:s3cret@127.0.0.1:{port}/0"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """(port, CA file) of a TLS-only server."""
    directory = tmp_path_factory.mktemp("redis-tls")
    files = make_tls_files(directory / "certs")
    port = free_port()
    config = (
        f"port 0\ntls-port {port}\ntls-cert-file {files['server.crt']}\ntls-key-file {files['server.key']}\n"
        f"tls-ca-cert-file {files['ca.crt']}\ntls-auth-clients no\n"
    )
    server = RedisServer(directory / "server", config)
    try:
        server.wait_ready(
            redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(files["ca.crt"]))
        )
        yield port, str(files["ca.crt"])
    finally:
        server.stop()


@pytest.fixture(scope="module")
def sentinel_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """(Sentinel URL, master port): a master with a password, watched by a sentinel with its own."""
    master_port, sentinel_port = free_port(), free_port()
    master = RedisServer(tmp_path_factory.mktemp("redis-master"), f"port {master_port}\nrequirepass mpw\n")
    sentinel_config = (
        f"port {sentinel_port}\nrequirepass spw\nsentinel monitor kumiko 127.0.0.1 {master_port} 1\n"
        "sentinel auth-pass kumiko mpw\n"
    )
    sentinel = RedisServer(tmp_path_factory.mktemp("redis-sentinel"), sentinel_config, sentinel=True)
    try:
        master.wait_ready(redis.Redis(host="127.0.0.1", port=master_port, password="mpw"))
        sentinel.wait_ready(redis.Redis(host="127.0.0.1", port=sentinel_port, password="spw"))
        yield f"redis+sentinel://:mpw@127.0.0.1:{sentinel_port}/kumiko/0?sentinel_password=spw", master_port
    finally:
        sentinel.stop()
        master.stop()


def use_redis(settings: Any, url: str) -> None:
    settings.KUMIKO_JOBS = {**settings.KUMIKO_JOBS, "REDIS_URL": None, "REDIS": url}


def run_one_job_with_a_worker(url: str, start_worker: Any) -> tuple[JobRun, str]:
    """Dispatch here, run it with a real ``runjobs --burst`` on the same URL."""
    result = dispatch("tests.record", {"n": 1})
    worker = start_worker("worker", "--burst", env={"KUMIKO_REDIS_URL": url}, wait=False)
    assert worker.wait(60) == 0, worker.output()
    run = JobRun.objects.get(pk=result.run_id)
    assert run.status == RunStatus.SUCCEEDED, worker.output()
    assert result.job_id is not None
    return run, result.job_id


def assert_worked_there(client: redis.Redis, job_id: str) -> None:
    """The worker used this server: its epoch is there, and the succeeded job left it (RESULT_TTL 0)."""
    assert client.get(get_keys().epoch) is not None
    assert not client.exists(get_keys().job(job_id))


def test_password_url(settings: Any, start_worker: Any, password_url: str) -> None:
    use_redis(settings, password_url)
    _run, job_id = run_one_job_with_a_worker(password_url, start_worker)
    assert_worked_there(redis.Redis.from_url(password_url), job_id)

    use_redis(settings, password_url.replace("s3cret", "wrong-one"))
    with pytest.raises(QueueUnavailable) as caught:
        dispatch("tests.record", {})
    assert "wrong-one" not in str(caught.value) and "***" in str(caught.value)


def test_tls_url(settings: Any, start_worker: Any, tls: tuple[int, str]) -> None:
    port, ca_file = tls
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca_file}"
    use_redis(settings, url)
    _run, job_id = run_one_job_with_a_worker(url, start_worker)
    assert_worked_there(get_redis(), job_id)

    # Without the CA the server's certificate does not verify: TLS is checked, not just used.
    use_redis(settings, f"rediss://127.0.0.1:{port}/0")
    with pytest.raises(QueueUnavailable):
        dispatch("tests.record", {})


def test_sentinel_url(
    settings: Any, start_worker: Any, admin_client: Client, sentinel_url: tuple[str, int]
) -> None:
    url, master_port = sentinel_url
    use_redis(settings, url)
    _run, job_id = run_one_job_with_a_worker(url, start_worker)
    master = redis.Redis(host="127.0.0.1", port=master_port, password="mpw")
    assert_worked_there(master, job_id)

    # django-rq's dashboard reads the lanes through the same Sentinel.
    for n in range(2):
        dispatch("tests.record", {"n": n})
    page = admin_client.get("/django-rq/")
    counts = {queue["name"]: queue["jobs"] for queue in page.context["queues"]}
    assert counts[get_keys().queue_name("worker")] == 2
    assert master.llen(f"{get_keys().lane('worker')}q:t|") == 2
