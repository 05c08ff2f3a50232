"""Tenant-visible history: what a tenant may see of its own runs and failures.

A job declares ``tenant_visible_run=TenantVisibleRun(subject_fields=...)`` (the tenant sees its
runs: status, subject, times) and/or ``tenant_visible_failure=TenantVisibleFailure(message_key,
subject_fields=...)`` (a final failure leaves one ``TenantFailure`` per tenant, job and subject,
cleared by a later success). Runs without a tenant (system runs) are never tenant-visible.

The *subject* names what a run is about, in clear text: the canonical JSON of
``[[field, value], ...]`` sorted by field, a missing field as ``null``. It is computed once at
dispatch, travels in the job's metadata and is stored on the run; subject fields must be
primitive, so ``dispatch()`` refuses anything else before writing. One job has one subject:
when both declarations name subject fields, they must name the same ones (check E301).

``tenant_runs()`` and ``tenant_failures()`` return ``values()`` querysets of the fields in
``TENANT_RUN_FIELDS`` / ``TENANT_FAILURE_FIELDS``: a template built on them cannot reach a
payload, an error text, a traceback or a log line, because the rows do not hold them. Their rows
are ``SafeRow`` dicts, whose keys read as attributes too (``row.status``), as a model's would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.db.models import QuerySet
from django.db.models.query import ValuesIterable

from kumiko_jobs.definitions import JobDefinition
from kumiko_jobs.exceptions import InvalidPayload, InvalidTenant

# Width of the subject columns (JobRun.subject, TenantFailure.subject).
MAX_SUBJECT = 500
PRIMITIVES = (str, int, float, bool, type(None))

# What a tenant-facing UI may read. Never payload, error, traceback, logs, worker, user.
TENANT_RUN_FIELDS = ("id", "job_name", "subject", "status", "queued_at", "started_at", "finished_at")
TENANT_FAILURE_FIELDS = ("job_name", "subject", "message_key", "count", "first_failed_at", "last_failed_at")


class SafeRow(dict[str, Any]):
    """A row of ``tenant_runs()`` or ``tenant_failures()``: a dict of the safe fields only, whose
    keys read as attributes too (``row.status`` is ``row["status"]``)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"a tenant's row has no {name!r}; it holds only {', '.join(self)}") from None


class _SafeRows(ValuesIterable):
    """``values()`` rows as ``SafeRow``; kept by ``filter()``, ``order_by()`` and slicing."""

    def __iter__(self) -> Any:
        for row in super().__iter__():
            yield SafeRow(row)


def _safe_rows(rows: QuerySet[Any, dict[str, Any]]) -> QuerySet[Any, SafeRow]:
    # The values() queryset's own iterable, wrapped: Django copies it to every clone.
    rows._iterable_class = _SafeRows
    return rows  # type: ignore[return-value]


def subject_fields(definition: JobDefinition) -> tuple[str, ...]:
    """The fields a run's subject is built from ((), no subject)."""
    for declared in (definition.tenant_visible_run, definition.tenant_visible_failure):
        if declared is not None and declared.subject_fields:
            return tuple(declared.subject_fields)
    return ()


def is_tenant_visible(definition: JobDefinition, tenant_id: str | None) -> bool:
    """Whether the tenant may see this run (a system run never)."""
    return tenant_id is not None and definition.tenant_visible_run is not None


def subject_of(definition: JobDefinition, payload: Mapping[str, Any]) -> str | None:
    """The run's canonical subject, or None when the job names no subject fields.

    Raises InvalidPayload naming the field when a value is not primitive, or when the subject
    would not fit its column.
    """
    fields = subject_fields(definition)
    if not fields:
        return None
    for name in fields:
        value = payload.get(name)
        if not isinstance(value, PRIMITIVES):
            raise InvalidPayload(
                f"$.{name}",
                f"subject field {name!r} of job {definition.name!r} must be a str, int, float, bool or None "
                f"(it is stored in clear text as the run's subject), got {type(value).__name__}",
            )
    subject = canonical_subject({name: payload.get(name) for name in fields})
    if len(subject) > MAX_SUBJECT:
        raise InvalidPayload(
            f"$.{fields[0]}" if len(fields) == 1 else "$",
            f"the subject of job {definition.name!r} is {len(subject)} characters of JSON; at most "
            f"{MAX_SUBJECT} fit (subject fields should be ids, not text)",
        )
    return subject


def canonical_subject(values: Mapping[str, Any]) -> str:
    """``[[field, value], ...]`` sorted by field, as compact JSON."""
    pairs = [[name, values[name]] for name in sorted(values)]
    return json.dumps(pairs, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def parse_subject(subject: str | None) -> dict[str, Any] | None:
    """A stored subject back as a dict (None for none, or for a subject that is not ours)."""
    if subject is None:
        return None
    try:
        pairs = json.loads(subject)
        return {str(name): value for name, value in pairs}
    except (ValueError, TypeError):
        return None


def tenant_runs(
    tenant: Any, *, job: str | None = None, subject: str | Mapping[str, Any] | None = None
) -> QuerySet[Any, SafeRow]:
    """The tenant's tenant-visible runs, newest first, as ``SafeRow`` dicts of ``TENANT_RUN_FIELDS``
    (dropped runs left out: they never ran).

    ``job`` narrows to one job; ``subject`` to one subject, given as stored (a canonical JSON
    string) or as a mapping of field -> value (with ``job``, missing fields count as None).
    """
    from kumiko_jobs.models import JobRun, RunStatus

    # A dropped run (replaced by a newer one, canceled) never ran: nothing the tenant waits for.
    runs = JobRun.objects.filter(tenant_id=_tenant_id(tenant), tenant_visible=True).exclude(
        status=RunStatus.DROPPED
    )
    if job is not None:
        runs = runs.filter(job_name=job)
    if subject is not None:
        runs = runs.filter(subject=_subject_filter(subject, job))
    # The primary key breaks ties: a page boundary between equal times neither repeats nor drops.
    return _safe_rows(runs.order_by("-queued_at", "-id").values(*TENANT_RUN_FIELDS))


def tenant_failures(tenant: Any) -> QuerySet[Any, SafeRow]:
    """The tenant's open failure records, newest first, as ``SafeRow`` dicts of
    ``TENANT_FAILURE_FIELDS``."""
    from kumiko_jobs.models import TenantFailure

    return _safe_rows(
        TenantFailure.objects.filter(tenant_id=_tenant_id(tenant))
        .order_by("-last_failed_at", "-id")
        .values(*TENANT_FAILURE_FIELDS)
    )


def _tenant_id(tenant: Any) -> str:
    from kumiko_jobs.tenancy import normalise_tenant

    tenant_id = normalise_tenant(tenant)
    if tenant_id is None:
        # No tenant means system runs, which no tenant may see: refuse rather than list none.
        raise InvalidTenant("tenant_runs()/tenant_failures() need a tenant (a model instance or its id).")
    return tenant_id


def _subject_filter(subject: str | Mapping[str, Any], job: str | None) -> str:
    if isinstance(subject, str):
        # Any JSON spelling of the pairs finds the stored one ('[["id", 1]]' as '[["id",1]]').
        values = parse_subject(subject)
        return subject if values is None else canonical_subject(values)
    values = dict(subject)
    if job is not None:
        from kumiko_jobs.registry import registry

        definition = registry.find(job)
        fields = subject_fields(definition) if definition is not None else ()
        unknown = set(values) - set(fields)
        if fields and unknown:
            raise ValueError(f"Job {job!r} has subject fields {fields}, not {sorted(unknown)}.")
        values = {name: values.get(name) for name in fields} if fields else values
    return canonical_subject(values)
