"""Django settings of the benchmarks: the demo project plus the bench jobs, tuned like production.

The database comes from DATABASE_URL as in project.settings; ``python -m bench`` sets it to a
temporary SQLite file (or the PostgreSQL database it was given) before Django starts.
"""

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS, KUMIKO_JOBS, LOGGING

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]

# The demo tenants, or range(N) while bench/tenancy.py measures a fan-out to N tenants.
KUMIKO_JOBS = {**KUMIKO_JOBS, "ACTIVE_TENANTS": "bench.benchapp.tenants.active_tenant_ids"}

# DEBUG keeps every SQL statement in connection.queries: a per-job cost no deployment pays.
DEBUG = False

# Per-job lines are not what is measured: only warnings and errors reach the console.
LOGGING = {
    **LOGGING,
    "loggers": {
        **LOGGING["loggers"],
        "kumiko_jobs": {**LOGGING["loggers"]["kumiko_jobs"], "level": "WARNING"},
    },
}
