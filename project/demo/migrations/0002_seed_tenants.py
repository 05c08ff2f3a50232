from __future__ import annotations

from typing import Any

from django.db import migrations

TENANTS = (("Acme Corp", "acme"), ("Globex", "globex"), ("Initech", "initech"))


def seed(apps: Any, schema_editor: Any) -> None:
    tenant = apps.get_model("demo", "Tenant")
    for name, slug in TENANTS:
        tenant.objects.get_or_create(slug=slug, defaults={"name": name, "active": True})


def unseed(apps: Any, schema_editor: Any) -> None:
    apps.get_model("demo", "Tenant").objects.filter(slug__in=[slug for _, slug in TENANTS]).delete()


class Migration(migrations.Migration):
    dependencies = [("demo", "0001_initial")]
    operations = [migrations.RunPython(seed, unseed)]
