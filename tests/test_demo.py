"""The demo project: its jobs and scripted mix (fast), and ``manage.py demo --once`` end to end (slow)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from kumiko_jobs import Backoff
from kumiko_jobs.definitions import EventTrigger
from kumiko_jobs.models import JobRun
from kumiko_jobs.registry import registry
from project.demo import scenario
from project.demo.models import Tenant

ROOT = Path(__file__).resolve().parent.parent
TENANT_NAMES = ("Acme Corp", "Globex", "Initech")
# The demo waits up to 60 s for its runs; leave room for start-up and shutdown, but stay under
# pytest-timeout's 120 s so a hang is reported with the demo's output.
DEMO_TIMEOUT = 100


@pytest.mark.django_db  # the model checks ask the database for its features
def test_demo_jobs_are_registered_as_declared_and_pass_the_checks() -> None:
    assert set(scenario.JOB_OF_KIND.values()) <= {definition.name for definition in registry.all()}
    flaky = registry.get("demo.flaky_sync")
    assert (flaky.retries, flaky.backoff) == (2, Backoff("fixed", delay_ms=200))
    assert registry.get("demo.always_fails").retries == 1
    assert registry.get("demo.preview").lane == "api"
    triggers = registry.get("demo.index_note").triggers
    assert any(isinstance(t, EventTrigger) and t.events == ("note.created",) for t in triggers)
    assert registry.for_event("note.created") == [registry.get("demo.index_note")]
    # The demo's Django @task is a job like the others (the admin lists it).
    task = registry.get("project.demo.tasks.count_notes")
    assert task.task is not None and task.lane == "worker"
    call_command("check", fail_level="WARNING")  # raises SystemCheckError on any finding


@pytest.mark.parametrize("total", [18, 60, 61, 200])
def test_plan_gives_every_tenant_every_kind_and_one_failing_run(total: int) -> None:
    tenants = [Tenant(pk=pk, name=name, slug=name.lower()) for pk, name in enumerate(TENANT_NAMES, 1)]
    planned = scenario.plan(tenants, total)
    assert len(planned) == total
    for tenant in tenants:
        kinds = Counter(run.kind for run in planned if run.tenant is tenant)
        assert set(kinds) == set(scenario.KINDS)
        assert kinds["fails"] == 1
        if total >= 60:
            assert kinds["quick"] > sum(kinds.values()) // 2  # mostly quick
    # Tenants take turns, so no tenant's runs are all queued behind another's.
    assert [run.tenant for run in planned[:3]] == tenants


@pytest.mark.django_db
def test_unexpected_outcomes_name_each_run_that_ended_wrong(tenants: list[Tenant]) -> None:
    acme, now = tenants[0], timezone.now()

    def record(kind: scenario.Kind, status: str, attempt: int) -> JobRun:
        return JobRun(
            id=uuid.uuid4(), job_name=scenario.JOB_OF_KIND[kind], tenant_id=str(acme.pk), status=status,
            attempt=attempt, lane="worker", job_id=uuid.uuid4().hex, queued_at=now, finished_at=now,
        )  # fmt: skip

    kinds: list[scenario.Kind] = ["flaky", "flaky", "fails"]
    records = [record("flaky", "succeeded", 3), record("flaky", "succeeded", 2), record("fails", "failed", 2)]
    runs = [scenario.DispatchedRun(str(r.pk), acme, kind) for r, kind in zip(records, kinds, strict=True)]
    problems = scenario.unexpected_outcomes(runs, {str(r.pk): r for r in records}, "batch", planned=3)
    assert problems == [
        f"demo.flaky_sync for Acme Corp (run {records[1].pk}) ended succeeded on attempt 2 in lane worker, "
        "expected succeeded on attempt 3 in lane worker"
    ]
    missing = scenario.unexpected_outcomes(runs, {}, "batch", planned=4)
    assert missing[0] == "4 runs were planned but 3 were queued (emit matched no job?)"
    assert len(missing) == 4


def _database_url() -> str:
    """The test database as a URL for the demo subprocess (dj-database-url syntax)."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    if connection.vendor == "postgresql":
        password = f":{quote(settings['PASSWORD'], safe='')}" if settings.get("PASSWORD") else ""
        host = settings.get("HOST") or "127.0.0.1"
        port = f":{settings['PORT']}" if settings.get("PORT") else ""
        return f"postgres://{quote(settings['USER'], safe='')}{password}@{host}{port}/{settings['NAME']}"
    pytest.skip(f"the demo test knows SQLite and PostgreSQL, not {connection.vendor}")


def _table_rows(output: str) -> dict[str, list[int]]:
    """Tenant name -> [queued, running, succeeded, failed, total] from the demo's rich table."""
    rows: dict[str, list[int]] = {}
    for name in TENANT_NAMES:
        match = re.search(rf"^\W*{re.escape(name)}\W+(\d+)\W+(\d+)\W+(\d+)\W+(\d+)\W+(\d+)\W*$", output, re.M)
        if match:
            rows[name] = [int(value) for value in match.groups()]
    return rows


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_demo_once_runs_the_mix_to_the_expected_outcomes(kumiko_prefix: str, tenants: list[Tenant]) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "KUMIKO_QUEUE_PREFIX": kumiko_prefix,
        "DATABASE_URL": _database_url(),
        "COLUMNS": "120",  # rich's table width when not on a terminal
    }
    demo = subprocess.Popen(
        [sys.executable, "manage.py", "demo", "--once"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        output, _ = demo.communicate(timeout=DEMO_TIMEOUT)
    except subprocess.TimeoutExpired:
        demo.terminate()  # SIGTERM: the demo stops its workers before exiting
        output, _ = demo.communicate(timeout=20)
        pytest.fail(f"manage.py demo --once did not finish within {DEMO_TIMEOUT}s:\n{output}")

    assert demo.returncode == 0, output
    rows = _table_rows(output)
    assert set(rows) == set(TENANT_NAMES), output
    for name, (queued, running, succeeded, failed, total) in rows.items():
        assert (queued, running, failed) == (0, 0, 1), f"{name}: {output}"
        assert succeeded + failed == total == 20, f"{name}: {output}"
    assert "Every run ended as expected" in output
    assert "/admin/kumiko_jobs/jobrun/" in output
    assert re.search(r"^Login: admin / \S+", output, re.M), output


@pytest.mark.django_db(transaction=True)
def test_tenant_jobs_page_shows_the_tenants_runs_and_problems_to_its_members_only(
    client: Any, django_user_model: Any
) -> None:
    from kumiko_jobs import dispatch
    from kumiko_jobs.testing import drain

    acme, globex = (
        Tenant.objects.get_or_create(slug=s, defaults={"name": n})[0]
        for n, s in (("Acme Corp", "acme"), ("Globex", "globex"))
    )
    dispatch("demo.always_fails", {"text": "x", "seq": 7}, tenant=acme)
    dispatch("demo.flaky_sync", {"text": "y", "seq": 8}, tenant=acme)
    dispatch("demo.always_fails", {"text": "z", "seq": 9}, tenant=globex)
    drain()
    member = django_user_model.objects.create_user("acme-reader")
    acme.members.add(member)
    client.force_login(member)
    html = client.get("/tenants/acme/jobs/").content.decode()
    assert "Invoice export #7:</b> The export could not be produced." in html
    assert "Partner sync" in html and "Done" in html and "Failed 1 time," in html
    assert "#9" not in html  # Globex's
    assert "template is missing" not in html and "timed out" not in html  # error texts
    assert client.get("/tenants/globex/jobs/").status_code == 404
    client.logout()
    assert client.get("/tenants/acme/jobs/").status_code == 302  # to the login
