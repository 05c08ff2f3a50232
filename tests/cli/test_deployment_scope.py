"""Deployments (QUEUE_PREFIX) that share one database: ``jobs stats`` counts its own runs."""

from __future__ import annotations

import json
import re
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from kumiko_jobs import dispatch
from kumiko_jobs.models import JobRun, RunStatus
from kumiko_jobs.testing import drain, isolated_prefix

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> str:
    out = StringIO()
    call_command("jobs", *args, stdout=out)
    return out.getvalue()


def busiest(table: str, lane: str) -> dict[str, int]:
    """The "busiest tenants" cell of a lane's row: {tenant: unfinished runs}."""
    row = next(line for line in table.splitlines() if re.search(rf"\b{lane}\b", line))
    return {tenant: int(runs) for tenant, runs in re.findall(r"(\S+) \((\d+)\)", row)}


def test_stats_counts_only_this_deployments_runs(tenants: Any) -> None:
    with isolated_prefix():  # another deployment on the same database
        for _ in range(4):
            dispatch("tests.record", {}, tenant=tenants[0])
        dispatch("tests.record", {}, tenant=tenants[1])
    dispatch("tests.record", {}, tenant=tenants[0])
    assert JobRun.objects.filter(status=RunStatus.QUEUED).count() == 6

    # Redis' counts were per prefix already; the run table's busiest tenants are what is scoped.
    assert json.loads(run("stats", "--json"))["worker"]["queued"] == 1
    assert busiest(run("stats"), "worker") == {str(tenants[0].pk): 1}


def test_list_shows_only_this_deployments_last_success() -> None:
    with isolated_prefix():
        dispatch("tests.record", {})
        assert drain() == {"succeeded": 1}

    listed = {job["name"]: job for job in json.loads(run("list", "--json"))}

    assert listed["tests.record"]["last_success_at"] is None
