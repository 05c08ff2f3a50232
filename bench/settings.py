"""Django settings of the benchmarks: the demo project plus the bench jobs, with Django's defaults
(no CONN_MAX_AGE tuning; runjobs is started with -v 0, so per-job lines are not printed).

The database comes from DATABASE_URL as in project.settings; ``python -m bench`` sets it to a
temporary SQLite file (or the PostgreSQL database it was given) before Django starts.
"""

import os

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS, KUMIKO_JOBS

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]

# The demo tenants, or range(N) while bench/tenancy.py measures a fan-out to N tenants.
KUMIKO_JOBS = {**KUMIKO_JOBS, "ACTIVE_TENANTS": "bench.benchapp.tenants.active_tenant_ids"}

# DEBUG keeps every SQL statement in connection.queries: a per-job cost no deployment pays.
DEBUG = False

# runjobs -v 0 shows warnings only; the worker's own few lines per process (banner, shutdown
# with "database connections opened: N", the supervisor's) stay visible, so the bench can
# report the connections a worker opened. Per-attempt lines (kumiko_jobs.runs) stay off.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "kumiko_jobs": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
        "kumiko_jobs.worker": {"level": "INFO"},
    },
}

# The bench's own telemetry (bench/observability.py): none by default, so the other sections
# measure kumiko_jobs with the OpenTelemetry API only (no SDK). KUMIKO_BENCH_OTEL in a child:
# "sdk" installs the SDK's tracer and meter providers with no exporter (no span processor, no
# metric reader: what `OTEL_TRACES_EXPORTER=none` gives); "export" adds a batch span processor
# whose exporter drops the spans and a metric reader that aggregates (in-process export costs).
DEMO_TELEMETRY = {"traces": "none", "metrics": "none"}
if os.environ.get("KUMIKO_BENCH_OTEL") in ("sdk", "export"):
    from bench.otel_sdk import install

    install(exporting=os.environ["KUMIKO_BENCH_OTEL"] == "export")
