"""Settings of the django-tenants test project; the test passes the database and Redis in env."""

import os

SECRET_KEY = "django-insecure-kumiko-jobs-tenants-test-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

SHARED_APPS = [
    "django_tenants",
    "tests.integration.tenants_project.customers",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_rq",
    "kumiko_jobs",
    # Also shared: the public schema gets its own notes table (tenant-less runs write there).
    "tests.integration.tenants_project.notes",
]
TENANT_APPS = ["tests.integration.tenants_project.notes"]
INSTALLED_APPS = [*SHARED_APPS, *(app for app in TENANT_APPS if app not in SHARED_APPS)]
TENANT_MODEL = "customers.Client"
TENANT_DOMAIN_MODEL = "customers.Domain"

DATABASES = {
    "default": {
        "ENGINE": "django_tenants.postgresql_backend",
        "NAME": os.environ["KUMIKO_TENANTS_DB"],
        "USER": os.environ.get("KUMIKO_TENANTS_DB_USER", "postgres"),
        "HOST": os.environ.get("KUMIKO_TENANTS_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("KUMIKO_TENANTS_DB_PORT", "5432"),
    }
}
DATABASE_ROUTERS = ["django_tenants.routers.TenantSyncRouter"]

MIDDLEWARE: list[str] = []
ROOT_URLCONF = "tests.integration.tenants_project.urls"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

KUMIKO_JOBS = {
    "REDIS_URL": os.environ["KUMIKO_REDIS_URL"],
    "QUEUE_PREFIX": os.environ["KUMIKO_QUEUE_PREFIX"],
    "TENANT_MODEL": "customers.Client",
    "TENANT_ACTIVATOR": "kumiko_jobs.tenancy_schemas.schema_activator",
    "ACTIVE_TENANTS": "tests.integration.tenants_project.customers.tenants.active_tenant_ids",
}
