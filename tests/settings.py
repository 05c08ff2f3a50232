"""Test settings: the demo project plus a test app whose jobs the tests (and their workers) run."""

import os

from project.settings import *  # noqa: F403
from project.settings import BASE_DIR, DATABASES, INSTALLED_APPS, KUMIKO_JOBS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not :memory:, so runjobs subprocesses see the test database (they get its path in
    # DATABASE_URL); one per pytest process, so concurrent test runs don't share it.
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / f".test-{os.getpid()}.sqlite3")}
else:
    DATABASES["default"]["TEST"] = {"NAME": f"test_kumiko_{os.getpid()}"}

# tests/integration starts runjobs subprocesses; a test may shorten timings for its worker with
# env KUMIKO_TEST_<KEY> (seconds), e.g. KUMIKO_TEST_UNKNOWN_JOB_GRACE=1, and set RELEASE with
# KUMIKO_TEST_RELEASE. KUMIKO_TEST_SCHEDULES declares the opt-in test jobs of tests/testapp/jobs.py.
_TIMINGS = (
    "ABANDON_AFTER",
    "HEARTBEAT_INTERVAL",
    "UNKNOWN_JOB_GRACE",
    "UNKNOWN_JOB_RETRY_DELAY",
    "ORPHAN_GRACE",
    "BOOT_GATE_WARN_AFTER",
    "CRON_CATCH_UP",
    "TENANT_ZONE_REFRESH",
    "STUCK_AFTER",
)
KUMIKO_JOBS = {
    **KUMIKO_JOBS,
    # Tests put tenants in zones through a Redis hash (tests/testapp/tenants.py: set_zones).
    "TENANT_TIMEZONE": "tests.testapp.tenants.tenant_timezone",
    **{
        key: float(os.environ[f"KUMIKO_TEST_{key}"]) for key in _TIMINGS if f"KUMIKO_TEST_{key}" in os.environ
    },
    **({"RELEASE": os.environ["KUMIKO_TEST_RELEASE"]} if "KUMIKO_TEST_RELEASE" in os.environ else {}),
}

if os.environ.get("KUMIKO_TEST_POOLED"):
    # A process of tests/integration/test_pgbouncer.py, configured as Django's docs ask of a
    # project behind a pooler in transaction mode (the demo's ACTIVE_TENANTS uses .iterator()).
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True

if os.environ.get("KUMIKO_TEST_REDIS_CACHE"):
    # A worker of tests/integration/test_redis_cache.py: kumiko's Redis is a django-redis cache's
    # pool (env: that cache's URL), not REDIS_URL.
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": os.environ["KUMIKO_TEST_REDIS_CACHE"],
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 5, "SOCKET_TIMEOUT": 5},
        }
    }
    KUMIKO_JOBS = {**KUMIKO_JOBS, "REDIS_URL": None, "REDIS": "cache:default"}

# No exporter unless a test's environment asks (OTEL_TRACES_EXPORTER=console for a runjobs
# subprocess whose spans a test reads); in-process tests install the SDK themselves (tests/otel.py).
DEMO_TELEMETRY = {"traces": "none", "metrics": "none"}
