"""Per-tenant fan-out: a wrapper run enqueues one child run per active tenant.

Children get deterministic job ids (wrapper id + tenant), and the dedup that keeps a wrapper
retry from enqueuing a tenant twice is the JobRun table's unique job id, not the presence of
a Redis hash, so it holds whatever Redis retention is configured.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from itertools import islice
from typing import Any

from django.utils.module_loading import import_string

from kumiko_jobs import records
from kumiko_jobs.conf import get_config
from kumiko_jobs.connection import get_keys
from kumiko_jobs.definitions import JobDefinition
from kumiko_jobs.dispatching import PER_TENANT_PREFIX, prepare
from kumiko_jobs.execution import failed_attempt
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.models import JobRun
from kumiko_jobs.outcomes import Outcome
from kumiko_jobs.pushing import PreparedJob, push, push_batch
from kumiko_jobs.registry import registry
from kumiko_jobs.scheduling.specs import tick_job_id
from kumiko_jobs.scheduling.zones import tenants_in_zone

BATCH = 1000
_SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,40}$")


def child_job_id(wrapper_job_id: str, tenant_id: str) -> str:
    part = (
        tenant_id
        if _SAFE_ID.match(tenant_id)
        else hashlib.sha1(tenant_id.encode(), usedforsecurity=False).hexdigest()[:20]
    )
    return f"{wrapper_job_id}-t-{part}"


def active_tenant_ids() -> Iterable[Any]:
    path = get_config().get("ACTIVE_TENANTS")
    if not path:
        raise RuntimeError(
            "per_tenant jobs need KUMIKO_JOBS['ACTIVE_TENANTS']: the dotted path of a function "
            "returning the active tenant ids."
        )
    source = import_string(path) if isinstance(path, str) else path
    return source()  # type: ignore[no-any-return]


def _batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


def run_fan_out(
    job_id: str, meta: JobMeta, payload: dict[str, Any], *, worker: str, consumer_lane: str
) -> Outcome:
    target_name = meta.job_name.removeprefix(PER_TENANT_PREFIX)
    now = datetime.now(UTC)
    records.safe(records.mark_running, meta=meta, job_id=job_id, payload=payload, worker=worker, now=now)
    definition = registry.find(target_name)
    try:
        if definition is None:
            registry.get(target_name)  # raises UnknownJob with close matches
            raise AssertionError("unreachable")
        total = 0
        base_id, tenants = _children_of(job_id, meta, definition)
        for batch in _batches(tenants, BATCH):
            total += _enqueue_batch(definition, base_id, meta, payload, [str(t) for t in batch])
    except Exception as exc:
        return failed_attempt(definition, job_id, meta, exc, [])
    done = datetime.now(UTC)
    line = {
        "t": done.isoformat(),
        "level": "info",
        "msg": f"fanned out to {total} tenants",
        "attempt": meta.attempt,
    }
    JobRun.objects.filter(pk=meta.run_id).update(fanout_count=total)
    records.safe(records.mark_succeeded, meta=meta, now=done, logs=[line])
    return Outcome("ok", ttl=int(get_config()["RESULT_TTL"]), counted_as="succeeded")


def _children_of(job_id: str, meta: JobMeta, definition: JobDefinition) -> tuple[str, Iterable[Any]]:
    """The id the children's ids derive from, and the tenants to fan out to. A tz="tenant" cron
    wrapper names its zone and reaches that zone's tenants only; its children's ids derive from
    the tick, not the zone, so a tenant listed in two zones' wrappers of one tick runs once."""
    if meta.zone and meta.scheduled_at is not None:
        base = tick_job_id(get_keys(), definition.name, meta.scheduled_at)
        return base, tenants_in_zone(meta.zone)
    return job_id, active_tenant_ids()


def spread_delay(definition: JobDefinition, tenant_id: str) -> float:
    """A tenant's fixed offset in [0, spread) seconds: the same tenant runs at the same point of
    every spread tick, and the children of one tick are spread evenly."""
    if not definition.spread:
        return 0.0
    digest = hashlib.sha1(f"{definition.name}|{tenant_id}".encode(), usedforsecurity=False).digest()
    return float(definition.spread) * int.from_bytes(digest[:4]) / 2**32


def _enqueue_batch(
    definition: JobDefinition, wrapper_id: str, meta: JobMeta, payload: dict[str, Any], tenants: list[str]
) -> int:
    ids = {tenant: child_job_id(wrapper_id, tenant) for tenant in tenants}
    existing = set(JobRun.objects.filter(job_id__in=list(ids.values())).values_list("job_id", flat=True))
    prepared: list[PreparedJob] = [
        prepare(
            definition,
            payload,
            tenant_id=tenant,
            user_id=meta.triggered_by,
            correlation_id=meta.correlation_id,
            trigger_name=meta.trigger_name,
            job_id=child_id,
            unique=True,
            # Same id on every attempt, so a row recorded late matches what Redis holds.
            run_id=uuid.uuid5(uuid.NAMESPACE_URL, child_id),
            delay=spread_delay(definition, tenant),
            scheduled_at=meta.scheduled_at,
        )
        for tenant, child_id in ids.items()
        if child_id not in existing
    ]
    if prepared:
        # The batch script knows skip limits but not replace/debounce or delays: those children go
        # one by one.
        simple = not (prepared[0].gates.replace or prepared[0].gates.debounce_key or definition.spread)
        outcomes = push_batch(prepared) if simple else push(prepared)
        # Rows for every child not yet recorded, pushed now or by an attempt that crashed before
        # recording ("duplicate"): the unique job id makes this idempotent.
        records.insert_queued(
            [p.row for p, o in zip(prepared, outcomes, strict=True) if o.status in ("queued", "duplicate")]
        )
    return len(tenants)
