"""django-tenants activator: runs only where django-tenants (and its PostgreSQL setup) exists."""

from __future__ import annotations

import importlib.util

import pytest

from kumiko_jobs.tenancy_schemas import schema_activator

HAS_DJANGO_TENANTS = importlib.util.find_spec("django_tenants") is not None


@pytest.mark.skipif(HAS_DJANGO_TENANTS, reason="django-tenants is installed: the error path does not apply")
def test_without_django_tenants_the_activator_says_what_to_install() -> None:
    with pytest.raises(RuntimeError, match=r"pip install 'kumiko_jobs\[tenants\]'"), schema_activator("1"):
        pass


@pytest.mark.skipif(
    not HAS_DJANGO_TENANTS,
    reason="django-tenants is not installed (optional extra kumiko_jobs[tenants]); its schema activator "
    "needs a django-tenants project on PostgreSQL, which this test project is not",
)
def test_schema_activator_switches_schema() -> None:  # pragma: no cover - needs a django-tenants project
    from django.db import connection

    with schema_activator(None):
        assert connection.schema_name == "public"  # type: ignore[attr-defined]
