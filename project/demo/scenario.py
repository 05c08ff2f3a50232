"""The demo's scripted mix of jobs: what to dispatch per tenant, and how each run must end."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from typing import Literal

from django.db import transaction
from django.db.models import Count
from django_scopes import scope, scopes_disabled

from kumiko_jobs import dispatch, emit
from kumiko_jobs.models import JobRun
from kumiko_jobs.tenancy import tenant_context
from project.demo.jobs import FLAKY_SUCCEEDS_ON
from project.demo.models import Note, Tenant
from project.demo.tasks import count_notes

Kind = Literal["quick", "flaky", "fails", "api", "event", "task"]
KINDS: tuple[Kind, ...] = ("quick", "flaky", "fails", "api", "event", "task")
JOB_OF_KIND: dict[Kind, str] = {
    "quick": "demo.write_note",
    "flaky": "demo.flaky_sync",
    "fails": "demo.always_fails",
    "api": "demo.preview",
    "event": "demo.index_note",
    # A Django @task: its job is named by its import path.
    "task": count_notes.module_path,
}
NOTE_WRITING_KINDS: tuple[Kind, ...] = ("quick", "event")


@dataclass(frozen=True)
class Expected:
    status: str
    attempt: int
    lane: str = "worker"

    def describe(self) -> str:
        return f"{self.status} on attempt {self.attempt} in lane {self.lane}"


EXPECTED: dict[Kind, Expected] = {
    "quick": Expected("succeeded", attempt=1),
    "flaky": Expected("succeeded", attempt=FLAKY_SUCCEEDS_ON),
    "fails": Expected("failed", attempt=2),
    "api": Expected("succeeded", attempt=1, lane="api"),
    "event": Expected("succeeded", attempt=1),
    "task": Expected("succeeded", attempt=1),
}


@dataclass(frozen=True)
class PlannedRun:
    tenant: Tenant
    kind: Kind
    seq: int


@dataclass(frozen=True)
class DispatchedRun:
    run_id: str
    tenant: Tenant
    kind: Kind


def min_jobs(tenant_count: int) -> int:
    """Smallest --jobs that gives every tenant one run of every kind."""
    return tenant_count * len(KINDS)


def plan(tenants: Sequence[Tenant], total: int) -> list[PlannedRun]:
    """``total`` runs shared evenly by the tenants: per tenant exactly one always-failing run,
    about a tenth each of flaky, api, event and Django-task runs (at least one), the rest quick.

    Tenants are interleaved so they progress side by side, as fair dequeueing should show.
    """
    per_tenant: list[list[PlannedRun]] = []
    for index, tenant in enumerate(tenants):
        share = total // len(tenants) + (1 if index < total % len(tenants) else 0)
        specials: list[Kind] = [*("flaky", "api", "event", "task") * max(1, share // 10), "fails"]
        kinds = _spread(specials, share)
        per_tenant.append([PlannedRun(tenant, kind, seq) for seq, kind in enumerate(kinds, 1)])
    return [run for batch in zip_longest(*per_tenant) for run in batch if run is not None]


def _spread(specials: Sequence[Kind], share: int) -> list[Kind]:
    """``share`` slots of quick runs with the special ones spread evenly among them."""
    slots: list[Kind] = ["quick"] * share
    for index, kind in enumerate(specials):
        # Slot centres are at least one apart while share >= len(specials): no collisions.
        slots[(2 * index + 1) * share // (2 * len(specials))] = kind
    return slots


def dispatch_planned(
    runs: Iterable[PlannedRun], batch: str, on_dispatched: Callable[[], object] = lambda: None
) -> list[DispatchedRun]:
    """Dispatch every planned run; ``batch`` tags the notes so checks count only this demo's."""
    dispatched: list[DispatchedRun] = []
    for run in runs:
        text = f"{batch} {run.tenant.slug} #{run.seq}"
        if run.kind == "event":
            run_ids = _create_note_and_emit(run, text)
        elif run.kind == "task":
            # Django's API: the tenant is the current one, as a request middleware would set it.
            with tenant_context(str(run.tenant.pk)):
                run_ids = [count_notes.enqueue(text).id]
        else:
            result = dispatch(JOB_OF_KIND[run.kind], {"text": text, "seq": run.seq}, tenant=run.tenant)
            run_ids = [result.run_id] if result.run_id is not None else []
        dispatched += [DispatchedRun(run_id, run.tenant, run.kind) for run_id in run_ids]
        on_dispatched()
    return dispatched


def _create_note_and_emit(run: PlannedRun, text: str) -> list[str]:
    # As a view would: write in the tenant's scope and emit in the same transaction, so the
    # event's jobs reach Redis only once the note is committed (and never if it rolls back).
    with scope(tenant=run.tenant.pk), transaction.atomic():
        note = Note.objects.create(tenant=run.tenant, text=text)
        results = emit("note.created", {"note_id": note.pk}, tenant=run.tenant)
    return [result.run_id for result in results if result.run_id is not None]


def expected_notes(runs: Iterable[DispatchedRun]) -> Counter[int]:
    return Counter(run.tenant.pk for run in runs if run.kind in NOTE_WRITING_KINDS)


def notes_written(batch: str) -> Counter[int]:
    with scopes_disabled():
        rows = Note.objects.filter(text__startswith=f"{batch} ").values("tenant_id").annotate(n=Count("pk"))
        return Counter({row["tenant_id"]: row["n"] for row in rows})


def unexpected_outcomes(
    runs: Sequence[DispatchedRun], records: Mapping[str, JobRun], batch: str, planned: int
) -> list[str]:
    """Every way the finished demo differs from ``EXPECTED``; empty when all is well."""
    problems: list[str] = []
    if len(runs) != planned:
        problems.append(f"{planned} runs were planned but {len(runs)} were queued (emit matched no job?)")
    for run in runs:
        record, expected = records.get(run.run_id), EXPECTED[run.kind]
        if record is None:
            problems.append(f"{JOB_OF_KIND[run.kind]} for {run.tenant}: run {run.run_id} has no record")
            continue
        got = Expected(record.status, record.attempt, record.lane)
        if got != expected:
            problems.append(
                f"{record.job_name} for {run.tenant} (run {run.run_id}) ended {got.describe()}, "
                f"expected {expected.describe()}" + (f"; error: {record.error}" if record.error else "")
            )
    want, have = expected_notes(runs), notes_written(batch)
    problems += [
        f"tenant {tenant.name}: {have[tenant.pk]} notes written, expected {want[tenant.pk]}"
        for tenant in sorted({run.tenant for run in runs}, key=lambda tenant: tenant.pk)
        if have[tenant.pk] != want[tenant.pk]
    ]
    return problems
