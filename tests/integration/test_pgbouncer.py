"""End to end behind a real PgBouncer in transaction mode (Debian 12's 1.18, which keeps no
prepared statement across transactions): a dispatching process and runjobs workers whose
database is PgBouncer lose the statements kumiko_jobs prepares (pg_pipeline.py), switch to
unprepared ones once, say so, and every run is recorded and succeeds.

PgBouncer gets a pool of two server connections, both opened before the test's clients come,
and hands them out in turn (server_round_robin), as a busy pool does: a statement prepared in
one transaction is then missing in the next.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from kumiko_jobs.models import JobRun, RunStatus
from tests.integration.support import REPO_ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PgBouncer pools PostgreSQL connections"),
]

MISSING = "a prepared statement went missing on database 'default'"
RUNS = 30


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def pgbouncer_url(transactional_db: None) -> Iterator[str]:
    """A DATABASE_URL for the test database through a private PgBouncer, stopped afterwards."""
    binary = os.environ.get("KUMIKO_PGBOUNCER") or shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(binary).exists():
        pytest.fail(f"no {binary}: `make test` installs Debian's pgbouncer (apt-get install -y pgbouncer)")
    settings = connection.settings_dict
    user, name = settings["USER"] or "postgres", settings["NAME"]
    host, port = settings["HOST"] or "127.0.0.1", settings["PORT"] or 5432
    listen = _free_port()
    # Not pytest's tmp_path: PgBouncer refuses to run as root, so it runs as the postgres user
    # (there is one where PostgreSQL is installed) and must be able to read its files.
    workdir = Path(tempfile.mkdtemp(prefix="kumiko-pgbouncer-"))
    workdir.chmod(0o755)
    (workdir / "users.txt").write_text(f'"{user}" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        f"[databases]\n{name} = host={host} port={port} dbname={name}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {workdir / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 2\nserver_round_robin = 1\n"
        # psycopg and Django send these at connect; PgBouncer would refuse the connection.
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    for path in workdir.iterdir():
        path.chmod(0o644)
    as_user = ["-u", "postgres"] if os.geteuid() == 0 else []
    log = (workdir / "pgbouncer.log").open("wb")
    proc = subprocess.Popen(
        [binary, *as_user, str(workdir / "pgbouncer.ini")], stdout=log, stderr=subprocess.STDOUT
    )
    url = f"postgres://{user}@127.0.0.1:{listen}/{name}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                # Two transactions at once open both server connections of the pool.
                with psycopg.connect(url) as first, psycopg.connect(url) as second:
                    first.execute("SELECT 1")
                    second.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"pgbouncer did not start:\n{(workdir / 'pgbouncer.log').read_text()}"
                    ) from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
        print((workdir / "pgbouncer.log").read_text())
        shutil.rmtree(workdir, ignore_errors=True)


def _dispatch_through(url: str, env: dict[str, str], tag: str, records: int = RUNS) -> str:
    """Dispatch ``records`` runs of tests.record and one fan-out wrapper (the worker reads the
    tenants and writes its children's rows in one batch) from a process whose database is
    ``url``."""
    code = (
        "from kumiko_jobs import dispatch\n"
        f"for i in range({records}):\n"
        f"    dispatch('tests.record', {{'n': i}}, correlation_id={tag!r})\n"
        f"dispatch('tests.per_tenant', {{}}, correlation_id={tag!r})\n"
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=REPO_ROOT,
        env={**env, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


@pytest.mark.parametrize("threads", ["1", "4"])
def test_dispatch_and_workers_behind_pgbouncer_switch_to_unprepared_and_lose_nothing(
    pgbouncer_url: str, worker_env: dict[str, str], start_worker: Any, tenants: list[Any], threads: str
) -> None:
    pooled = {**worker_env, "KUMIKO_TEST_POOLED": "1"}  # DISABLE_SERVER_SIDE_CURSORS, as Django asks
    output = _dispatch_through(pgbouncer_url, pooled, "pooled")
    # One client, transactions one after another: they land on the two server connections in
    # turn, so the second dispatch finds the statements the first prepared missing.
    assert output.count(MISSING) == 1, output
    runs = JobRun.objects.filter(correlation_id="pooled", job_name="tests.record")
    assert runs.count() == RUNS
    assert None not in set(runs.values_list("pushed_at", flat=True))

    worker = start_worker(
        "worker",
        "--burst",
        "--threads",
        threads,
        env={"DATABASE_URL": pgbouncer_url, "KUMIKO_TEST_POOLED": "1"},
        wait=False,
    )
    assert worker.wait(60) == 0, worker.output()
    assert runs.filter(status=RunStatus.SUCCEEDED).count() == RUNS, worker.output()
    assert sorted(runs.values_list("payload__n", flat=True)) == list(range(RUNS))
    wrapper = JobRun.objects.get(job_name="_per_tenant:tests.per_tenant")
    assert (wrapper.status, wrapper.fanout_count) == (RunStatus.SUCCEEDED, len(tenants)), worker.output()
    children = JobRun.objects.filter(job_name="tests.per_tenant", status=RunStatus.SUCCEEDED)
    assert sorted(children.values_list("tenant_id", flat=True)) == sorted(str(t.pk) for t in tenants)
    # The worker's own writes went through PgBouncer too, and none failed.
    assert "run record write" not in worker.output()
    if threads == "1":
        # One connection, as the dispatcher: the switch is certain. With threads the writer's
        # connection may keep meeting its own server connection, so it is not asserted.
        assert worker.output().count(MISSING) == 1, worker.output()


def test_a_fan_out_whose_tenants_come_through_a_lost_server_side_cursor_fails_with_the_cure(
    pgbouncer_url: str, worker_env: dict[str, str], start_worker: Any, tenants: list[Any]
) -> None:
    """Without DISABLE_SERVER_SIDE_CURSORS, the demo's ACTIVE_TENANTS (.iterator()) declares its
    cursor on one server connection and fetches on the other: the wrapper fails, naming the cure,
    and enqueues no child.

    Only the wrapper, and no scheduler thread: the cursor's transactions then alternate between
    the two server connections. Other clients' transactions in between, such as the writer
    thread's success writes of earlier runs, could bring the FETCH back to the DECLARE's server
    connection, and the wrapper would succeed: with 30 runs before it, 1 of 10 runs failed."""
    _dispatch_through(pgbouncer_url, worker_env, "unpooled", records=0)
    worker = start_worker(
        "worker", "--burst", "--no-scheduler", env={"DATABASE_URL": pgbouncer_url}, wait=False
    )
    assert worker.wait(60) == 0, worker.output()
    wrapper = JobRun.objects.get(job_name="_per_tenant:tests.per_tenant")
    assert wrapper.status == RunStatus.FAILED
    assert wrapper.error.startswith(
        "ImproperlyConfigured: ACTIVE_TENANTS (project.demo.tenants.active_tenant_ids)"
    )
    assert '"DISABLE_SERVER_SIDE_CURSORS": True' in wrapper.error
    assert not JobRun.objects.filter(job_name="tests.per_tenant").exists()
