"""A new run, built before anything is written: its job hash fields and its run row
(``prepare``), or those of a run whose meta is known already (``prepared_from_meta``: a run
rebuilt from its record). dispatch(), emit(), fan-out, schedules, boot jobs, retries and the
tasks backend all build runs here; dispatching.py then records and pushes them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from kumiko_jobs import run_rows
from kumiko_jobs.conf import get_config
from kumiko_jobs.connection import get_keys
from kumiko_jobs.definitions import JobDefinition, wrapper_name
from kumiko_jobs.gates import Gates, gates_for
from kumiko_jobs.jobdata import JobMeta, encode_data, job_fields
from kumiko_jobs.observability import current_correlation_id, current_trace_carrier
from kumiko_jobs.pushing import PreparedJob
from kumiko_jobs.run_ids import new_run_id
from kumiko_jobs.task_payloads import task_priority
from kumiko_jobs.tenant_history import is_tenant_visible, subject_of


@dataclass(frozen=True)
class Encoded:
    """A payload encoded for the job hash and for the row, once for the runs that share it (a
    fan-out's children)."""

    data: bytes
    json: str


def encode(job_name: str, payload: Mapping[str, Any]) -> Encoded:
    """The payload encoded once: the row's JSON text, spliced into the job hash's data."""
    text = run_rows.encode_payload(payload)
    data = encode_data(job_name, payload, int(get_config()["MAX_PAYLOAD_BYTES"]), payload_json=text)
    return Encoded(data=data, json=text)


def prepare(
    definition: JobDefinition,
    payload: Mapping[str, Any],
    *,
    tenant_id: str | None,
    user_id: str | None,
    correlation_id: str | None = None,
    trigger_name: str = "",
    delay: float = 0.0,
    job_id: str | None = None,
    unique: bool = False,
    run_id: uuid.UUID | None = None,
    retry_of: uuid.UUID | None = None,
    fanout_of: str = "",
    fanout_parent: str = "",
    scheduled_at: float | None = None,
    zone: str = "",
    now: datetime | None = None,
    encoded: Encoded | None = None,
    trace: dict[str, str] | None = None,
) -> PreparedJob:
    """Build a new run's job hash fields and its row, from arguments already validated
    (``now``: its queued time, default now; the subject fields are checked here:
    InvalidPayload names a non-primitive one; ``encoded``: the payload encoded already, by
    ``encode`` with this job's name; ``trace``: ``current_trace_carrier()`` read already, by a
    caller preparing many)."""
    run_id = run_id or new_run_id()
    wrapper = definition.per_tenant and tenant_id is None
    gates = gates_for(definition, tenant_id, get_keys(), wrapper=wrapper)
    meta = JobMeta(
        run_id=str(run_id),
        job_name=wrapper_name(definition.name) if wrapper else definition.name,
        lane=definition.lane,
        tenant_id=tenant_id,
        triggered_by=user_id,
        trigger_name=trigger_name,
        correlation_id=correlation_id or current_correlation_id() or run_id.hex,
        attempt=1,
        max_attempts=definition.max_attempts,
        trace=current_trace_carrier() if trace is None else trace,
        flow=gates.flow,
        limit_keys=gates.limit_keys,
        fanout_of=fanout_of if wrapper else "",
        fanout_parent=fanout_parent,
        subject=subject_of(definition, payload),
        tenant_visible=is_tenant_visible(definition, tenant_id),
        scheduled_at=scheduled_at,
        zone=zone,
    )
    return prepared_from_meta(
        definition,
        meta,
        gates,
        payload,
        job_id=job_id,
        delay=delay,
        unique=unique,
        retry_of=retry_of,
        now=now,
        encoded=encoded,
        run_uuid=run_id,
    )


def prepared_from_meta(
    definition: JobDefinition,
    meta: JobMeta,
    gates: Gates,
    payload: Mapping[str, Any],
    *,
    job_id: str | None = None,
    delay: float = 0.0,
    unique: bool = False,
    retry_of: uuid.UUID | None = None,
    admit: bool = True,
    now: datetime | None = None,
    encoded: Encoded | None = None,
    queued_at: datetime | None = None,
    run_uuid: uuid.UUID | None = None,
) -> PreparedJob:
    """The job hash and row of a run whose meta is known (a new run, or one pushed again from
    its record, dispatched at ``queued_at``: a late push, see PreparedJob.late)."""
    config = get_config()
    keys = get_keys()
    now = now or timezone.now()
    seconds = max(delay, gates.debounce_seconds)
    run_at = now.timestamp() + seconds if seconds > 0 else 0.0
    run_id = run_uuid or uuid.UUID(meta.run_id)  # ``run_uuid``: meta.run_id parsed already
    jid = job_id or f"{keys.id_tag}-{run_id.hex}"
    encoded = encoded or encode(meta.job_name, payload)
    fields = job_fields(
        queue_name=keys.queue_name(definition.lane),
        data=encoded.data,
        meta=meta,
        now=now,
        timeout=definition.timeout,
        result_ttl=int(config["RESULT_TTL"]),
        failure_ttl=int(config["FAILURE_TTL"]),
        status="scheduled" if run_at else "queued",
        # A Django task's run waits in priority order; its payload says which (task_jobs.py).
        priority=task_priority(payload) if definition.task is not None else None,
        created=queued_at,
    )
    next_at = now + timedelta(seconds=seconds) if run_at else None
    row = run_rows.new_run_row(
        meta=meta,
        run_id=run_id,
        job_id=jid,
        payload=payload,
        queued_at=now,
        next_attempt_at=next_at,
        retry_of=retry_of,
        payload_json=encoded.json,
    )
    return PreparedJob(
        job_id=jid,
        lane=definition.lane,
        fields=fields,
        row=row,
        gates=gates,
        meta=meta,
        run_at=run_at,
        unique=unique,
        admit=admit,
        late=queued_at is not None,
    )
