"""Settings of the kumiko_jobs demo/test project.

Environment: DATABASE_URL (default: SQLite file demo.sqlite3), KUMIKO_REDIS_URL,
KUMIKO_QUEUE_PREFIX, DJANGO_SECRET_KEY, DJANGO_DEBUG.
"""

import os
from pathlib import Path
from typing import Any

import dj_database_url

# No django_stubs_ext.monkeypatch(): the package and the demo must run in a project that does
# not call it, so the test suite runs without it too.

BASE_DIR = Path(__file__).resolve().parent.parent

# A demo-only default so that `make demo` works out of the box; deployments set the variable.
# (ruff's S105 does not flag a getenv default, so no noqa is needed here.)
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-insecure-kumiko-jobs-demo-only-not-a-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1").lower() in ("1", "true", "yes", "on")
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_rq",
    "kumiko_jobs",
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Jobs dispatched during a request carry its X-Request-ID (or a new id) as correlation id.
    "kumiko_jobs.middleware.CorrelationMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

TEMPLATES: list[dict[str, Any]] = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES: dict[str, dict[str, Any]] = {
    "default": dict(
        # Django's connection defaults (CONN_MAX_AGE 0): workers keep their own connections
        # between jobs (kumiko_jobs/db_connections.py), so nothing is tuned here.
        dj_database_url.config(default=f"sqlite:///{BASE_DIR / 'demo.sqlite3'}")
    ),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The demo runs web and worker processes on one file: wait for locks instead of failing,
    # take the write lock at BEGIN (a deferred lock upgrade fails at once, whatever the timeout),
    # and let readers proceed while a worker writes (WAL). synchronous=NORMAL is the usual
    # WAL setting: commits survive a process crash and skip an fsync each (an OS crash may lose
    # the last ones) -- the demo's SQLite is not a production database.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }

AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []

LANGUAGE_CODE = "en-us"
USE_I18N = True
USE_TZ = True
TIME_ZONE = "UTC"

STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "admin:login"

REDIS_URL = os.environ.get("KUMIKO_REDIS_URL", "redis://127.0.0.1:6379/0")
QUEUE_PREFIX = os.environ.get("KUMIKO_QUEUE_PREFIX", "kumiko")

KUMIKO_JOBS: dict[str, Any] = {
    "REDIS_URL": REDIS_URL,
    "QUEUE_PREFIX": QUEUE_PREFIX,
    "ACTIVE_TENANTS": "project.demo.tenants.active_tenant_ids",
    "USER_TENANT": "project.demo.tenants.tenant_of_user",
    "TENANT_MODEL": "demo.Tenant",
}

# No RQ_QUEUES or RQ here: kumiko_jobs gives django-rq the lanes' queues and its queue class
# (kumiko_jobs/dashboard/setup.py), as it does in a user's project.

# Django's tasks framework on kumiko_jobs: a @task is a kumiko job, .enqueue() a kumiko run on
# the lane its queue_name names ("default", a task without queue_name, is the worker lane).
TASKS: dict[str, dict[str, Any]] = {
    "default": {"BACKEND": "kumiko_jobs.backends.KumikoTaskBackend", "QUEUES": ["worker", "api"]},
}

# No LOGGING: Django's default. runjobs gives itself timestamped output on stderr (-v 0..3);
# a project that configures the kumiko_jobs logger keeps its own (worker_logging.py).

# OpenTelemetry of the demo (project/telemetry.py): what is exported when the standard OTEL_*
# variables do not say. Spans go to stdout (the demo's workers write them to their logs), metrics
# are served for Prometheus at /metrics. The kumiko_jobs package needs only opentelemetry-api.
DEMO_TELEMETRY = {"traces": "console", "metrics": "prometheus"}
