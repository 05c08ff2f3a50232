"""End to end: ``kumiko_jobs.tenancy_schemas.schema_activator`` in a django-tenants project.

The project (tests/integration/tenants_project) gets its own PostgreSQL database, made here and
dropped afterwards; ``migrate_schemas`` and two tenants with their schemas are made through its
``manage.py`` in subprocesses, jobs are dispatched from its shell, a real ``runjobs --burst``
runs them, and the rows their handlers wrote are read back schema by schema with psycopg. The
notes table exists in the public schema too, so a run in the wrong schema leaves its row there
(or in the other tenant's) instead of failing: every schema's rows are asserted, not only the
expected ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from psycopg import sql

from kumiko_jobs.conf import redis_url
from kumiko_jobs.testing import forget_prefix
from tests.integration.support import REPO_ROOT, WorkerProcess

pytestmark = pytest.mark.slow

PG: dict[str, Any] = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}
SETTINGS = "tests.integration.tenants_project.settings"
TENANT_SCHEMAS = ("tenant_alpha", "tenant_beta")
SCHEMAS = ("public", *TENANT_SCHEMAS)

Rows = set[tuple[str, str, str]]


def pg(dbname: str) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(dbname=dbname, autocommit=True, **PG)


def project_env(database: str, prefix: str) -> dict[str, str]:
    """A subprocess of the tenants project on ``database`` and the Redis prefix ``prefix``."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return {
        **env,
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "KUMIKO_TENANTS_DB": database,
        "KUMIKO_TENANTS_DB_HOST": PG["host"],
        "KUMIKO_TENANTS_DB_PORT": str(PG["port"]),
        "KUMIKO_TENANTS_DB_USER": PG["user"],
        "KUMIKO_REDIS_URL": redis_url(),
        "KUMIKO_QUEUE_PREFIX": prefix,
        "PYTHONUNBUFFERED": "1",
    }


def manage(env: dict[str, str], *args: str) -> str:
    """``manage.py <args>`` of the tenants project; its stdout, or fail with all its output."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    if done.returncode != 0:
        output = done.stdout + done.stderr
        raise AssertionError(f"manage.py {' '.join(args)} exited {done.returncode}:\n{output}")
    return done.stdout


def scenario(env: dict[str, str], step: str) -> str:
    """Run ``tenants_project/scenario.py``'s function ``step`` in the project's shell."""
    code = f"from tests.integration.tenants_project import scenario; scenario.{step}()"
    return manage(env, "shell", "--no-imports", "-c", code)


@pytest.fixture(scope="module")
def project() -> Iterator[tuple[str, dict[str, int]]]:
    """(database, {"alpha": id, "beta": id}): a fresh database, migrated, with two tenants."""
    database = f"kumiko_tenants_{uuid.uuid4().hex[:8]}"
    setup_prefix = f"t{uuid.uuid4().hex[:10]}"
    with pg("postgres") as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    try:
        env = project_env(database, setup_prefix)
        manage(env, "migrate_schemas", "--noinput")
        # save() of a tenant creates its schema and migrates TENANT_APPS into it.
        tenant_ids: dict[str, int] = json.loads(scenario(env, "create_tenants").splitlines()[-1])
        yield database, tenant_ids
    finally:
        client = redis.Redis.from_url(redis_url())
        forget_prefix(client, setup_prefix)
        client.close()
        with pg("postgres") as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))


@pytest.fixture
def env(project: tuple[str, dict[str, int]], kumiko_prefix: str) -> Iterator[dict[str, str]]:
    """The project's environment on this test's Redis prefix, its notes and runs emptied first."""
    database, _ = project
    with pg(database) as conn:
        for schema in SCHEMAS:
            conn.execute(sql.SQL("TRUNCATE {}.notes_note").format(sql.Identifier(schema)))
        conn.execute("TRUNCATE public.kumiko_jobs_jobrun CASCADE")
    yield project_env(database, kumiko_prefix)


def run_worker(env: dict[str, str], tmp_path: Path) -> str:
    """A real ``runjobs --lane worker --burst`` of the project; its output once it exited 0."""
    name = f"{env['KUMIKO_QUEUE_PREFIX']}-worker"
    worker = WorkerProcess(["--lane", "worker", "--burst", "--name", name], env, tmp_path / f"{name}.log")
    try:
        code = worker.wait(60)
    finally:
        worker.stop()
    output = worker.output()
    assert code == 0, output
    return output


def notes(database: str) -> dict[str, Rows]:
    """schema -> {(label, tenant the handler saw, current_schema() it saw)} of its notes table."""
    with pg(database) as conn:
        return {
            schema: set(
                conn.execute(
                    sql.SQL("SELECT label, tenant, schema FROM {}.notes_note").format(sql.Identifier(schema))
                ).fetchall()
            )
            for schema in SCHEMAS
        }


def runs(database: str) -> set[tuple[str, str, str, str]]:
    """(job name, tenant id, status, error) of every run the project recorded."""
    with pg(database) as conn:
        rows = conn.execute(
            "SELECT job_name, coalesce(tenant_id, ''), status, error FROM public.kumiko_jobs_jobrun"
        ).fetchall()
    return set(rows)


def test_each_run_writes_in_its_tenants_schema_and_a_tenantless_run_in_public(
    project: tuple[str, dict[str, int]], env: dict[str, str], tmp_path: Path
) -> None:
    database, ids = project
    a, b = str(ids["alpha"]), str(ids["beta"])
    scenario(env, "dispatch_jobs")
    output = run_worker(env, tmp_path)

    assert runs(database) == {
        ("notes.write_note", a, "succeeded", ""),
        ("notes.write_note", b, "succeeded", ""),
        ("notes.write_note", "", "succeeded", ""),
        ("_per_tenant:notes.note_every_tenant", "", "succeeded", ""),
        ("notes.note_every_tenant", a, "succeeded", ""),
        ("notes.note_every_tenant", b, "succeeded", ""),
    }, output
    assert notes(database) == {
        "public": {("tenantless", "", "public")},
        "tenant_alpha": {("direct-alpha", a, "tenant_alpha"), (f"fanout-{a}", a, "tenant_alpha")},
        "tenant_beta": {("direct-beta", b, "tenant_beta"), (f"fanout-{b}", b, "tenant_beta")},
    }, output


def test_a_run_whose_tenant_was_deleted_fails_and_writes_nowhere(
    project: tuple[str, dict[str, int]], env: dict[str, str], tmp_path: Path
) -> None:
    database, _ = project
    gone = scenario(env, "dispatch_for_deleted_tenant").splitlines()[-1]
    output = run_worker(env, tmp_path)

    [(job_name, tenant, status, error)] = runs(database)
    assert (job_name, tenant, status) == ("notes.write_note", gone, "failed"), output
    assert error.startswith(f"InvalidTenant: Tenant '{gone}' does not exist (customers.Client)"), error
    assert notes(database) == {schema: set() for schema in SCHEMAS}


def test_an_async_handler_writes_in_its_tenants_schema(
    project: tuple[str, dict[str, int]], env: dict[str, str], tmp_path: Path
) -> None:
    database, ids = project
    a, b = str(ids["alpha"]), str(ids["beta"])
    scenario(env, "dispatch_async_jobs")
    output = run_worker(env, tmp_path)

    assert runs(database) == {
        ("notes.write_note_async", a, "succeeded", ""),
        ("notes.write_note_async", b, "succeeded", ""),
    }, output
    assert notes(database) == {
        "public": set(),
        "tenant_alpha": {("async-alpha", a, "tenant_alpha")},
        "tenant_beta": {("async-beta", b, "tenant_beta")},
    }, output
