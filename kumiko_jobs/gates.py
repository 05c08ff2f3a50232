"""Enqueue gates of a job for one tenant: its flow, skip limits, replace and debounce keys.

Computed in Python, enforced atomically by scripts.ENQUEUE/STEP: limits are counters of
queued+running runs per key (O(1), never a queue scan), caps are part of the flow name.
"""

from __future__ import annotations

from dataclasses import dataclass

from kumiko_jobs.definitions import JobDefinition
from kumiko_jobs.keys import Keys


@dataclass(frozen=True)
class Gates:
    flow: str
    # (limit key, limit, reason reported when it fires)
    limits: tuple[tuple[str, int, str], ...] = ()
    replace: bool = False
    debounce_key: str = ""
    debounce_seconds: float = 0.0

    @property
    def limit_keys(self) -> str:
        return "\n".join(key for key, _, _ in self.limits)


def gates_for(
    definition: JobDefinition, tenant_id: str | None, keys: Keys, *, wrapper: bool = False
) -> Gates:
    tenant = tenant_id or ""
    if wrapper:
        # A fan-out wrapper is bookkeeping; its children carry the job's gates.
        return Gates(flow=f"t|{tenant}")
    name = definition.name
    scope = f"{name}|{tenant}" if definition.concurrency_scope == "tenant" else name
    flow = f"t|{tenant}"
    limits: list[tuple[str, int, str]] = []
    mpt = definition.max_per_tenant
    if mpt is not None and tenant_id is not None:
        if mpt.on_limit == "skip":
            limits.append((f"m|{name}|{tenant}", mpt.limit, "max_per_tenant"))
        else:
            # Own flow with the cap in its name: only this (job, tenant) waits, never the
            # tenant's other work.
            flow = f"c{mpt.limit}|{name}|{tenant}"
    mode = definition.concurrency
    if mode == "skip":
        limits.append((f"k|{scope}", 1, "concurrency"))
    elif mode == "sequential":
        flow = f"c1|{scope}"
    elif mode == "replace":
        return Gates(flow=f"r|{scope}", limits=tuple(limits), replace=True)
    elif mode == "debounce":
        return Gates(
            flow=flow,
            limits=tuple(limits),
            debounce_key=keys.debounce(scope),
            debounce_seconds=definition.debounce_ms / 1000.0,
        )
    return Gates(flow=flow, limits=tuple(limits))
