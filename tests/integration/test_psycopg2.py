"""Django on psycopg2 instead of psycopg 3: run writes go through a cursor (pg_pipeline needs
psycopg 3's libpq pipeline), and a dispatch, a worker's outcome and the records agree. Run in a
subprocess whose ``import psycopg`` fails, so Django's PostgreSQL backend picks psycopg2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db import connection

from kumiko_jobs.models import JobRun, RunStatus
from tests.integration.support import REPO_ROOT

pytestmark = [pytest.mark.slow]

SCRIPT = """
import sys
sys.modules["psycopg"] = None  # Django falls back to psycopg2
import django
django.setup()
from django.db import connection
from kumiko_jobs import dispatch
from kumiko_jobs.testing import drain
assert connection.Database.__name__ == "psycopg2", connection.Database
runs = [dispatch("tests.record", {"n": n}) for n in range(3)]
print(drain())
print(" ".join(r.run_id for r in runs))
"""


def test_dispatch_and_outcomes_on_psycopg2(worker_env: dict[str, str]) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("psycopg2 is a PostgreSQL driver (this run uses SQLite)")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, env=worker_env,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    counts, ids = done.stdout.strip().splitlines()[-2:]
    assert counts == "{'succeeded': 3}", output
    # Before, every run write ended in psycopg2's NotSupportedError from cursor.nextset(), after
    # its statement had run: logged as a failed write, and the connection closed each time.
    assert "run record write" not in output and "NotSupportedError" not in output, output
    assert {r.status for r in JobRun.objects.filter(pk__in=ids.split())} == {RunStatus.SUCCEEDED}
