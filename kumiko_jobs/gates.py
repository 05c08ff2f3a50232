"""Enqueue gates of a job for one tenant: its flow, skip limits, replace and debounce keys.

Computed in Python, enforced atomically by the enqueue and finish-and-claim scripts: limits are
counters of queued+running runs per key (O(1), never a queue scan), caps are part of the flow
name (flows.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from kumiko_jobs import flows
from kumiko_jobs.definitions import JobDefinition
from kumiko_jobs.flows import Limit
from kumiko_jobs.keys import Keys


@dataclass(frozen=True)
class Gates:
    flow: str
    limits: tuple[Limit, ...] = ()
    replace: bool = False
    debounce_key: str = ""
    debounce_seconds: float = 0.0

    @property
    def limit_keys(self) -> str:
        return flows.join_keys(self.limits)


def gates_for(
    definition: JobDefinition, tenant_id: str | None, keys: Keys, *, wrapper: bool = False
) -> Gates:
    gates = _gates_for(definition, tenant_id, keys, wrapper=wrapper)
    if definition.task is not None:
        # A Django task's runs wait in priority order: the same flow, kept ordered.
        g = gates
        return Gates(flows.ordered_flow(g.flow), g.limits, g.replace, g.debounce_key, g.debounce_seconds)
    return gates


def _gates_for(definition: JobDefinition, tenant_id: str | None, keys: Keys, *, wrapper: bool) -> Gates:
    if wrapper:
        # A fan-out wrapper is bookkeeping; its children carry the job's gates.
        return Gates(flow=flows.tenant_flow(tenant_id))
    scope = flows.scope(definition.name, tenant_id, definition.concurrency_scope)
    flow = flows.tenant_flow(tenant_id)
    limits: list[Limit] = []
    mpt = definition.max_per_tenant
    capped = mpt is not None and mpt.on_limit == "defer" and tenant_id is not None
    if mpt is not None and tenant_id is not None:
        if mpt.on_limit == "skip":
            limits.append(flows.max_per_tenant_limit(definition.name, tenant_id, mpt.limit))
        else:
            # Own flow with the cap in its name: only this (job, tenant) waits, never the
            # tenant's other work.
            flow = flows.capped_flow(mpt.limit, flows.scope(definition.name, tenant_id, "tenant"))
    mode = definition.concurrency
    if mode == "skip":
        limits.append(flows.skip_limit(scope))
    elif mode == "sequential":
        # Cap 1 per scope is at least as strict as any max_per_tenant cap.
        flow = flows.capped_flow(1, scope)
    elif mode == "replace":
        # With a defer cap the capped (job, tenant) flow is the replace key's flow too (the
        # checks refuse the combination with concurrency_scope="job", whose key spans tenants).
        return Gates(flow=flow if capped else flows.replace_flow(scope), limits=tuple(limits), replace=True)
    elif mode == "debounce":
        return Gates(
            flow=flow,
            limits=tuple(limits),
            debounce_key=keys.debounce(scope),
            debounce_seconds=definition.debounce_ms / 1000.0,
        )
    return Gates(flow=flow, limits=tuple(limits))
