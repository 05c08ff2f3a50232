"""Jobs that write a Note where the activator put the connection (the test reads every schema)."""

from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection

from kumiko_jobs import job
from kumiko_jobs.tenancy import current_tenant_id
from tests.integration.tenants_project.notes.models import Note


def _write(label: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        (schema,) = cursor.fetchone()
    Note.objects.create(label=label, tenant=current_tenant_id() or "", schema=schema)


@job
def write_note(payload: dict[str, Any], ctx: Any) -> None:
    _write(payload["label"])


@job(per_tenant=True)
def note_every_tenant(payload: dict[str, Any], ctx: Any) -> None:
    _write(f"{payload['label']}-{ctx.tenant_id}")


@job
async def write_note_async(payload: dict[str, Any], ctx: Any) -> None:
    # The ORM from an async handler runs on the job thread's database thread.
    await sync_to_async(_write)(payload["label"])
