"""The grammar of flow names and limit keys: built and parsed here (and, mirrored, in Lua).

A lane keeps its queued job ids in *flows*, FIFO lists served round-robin (see scripts.py):

- ``t|<tenant>``: a tenant's ordinary runs (``t|`` for runs without a tenant);
- ``c<cap>|<scope>``: runs that may run at most ``cap`` at a time per scope (``max_per_tenant``
  defer, ``sequential``); the cap is part of the name so the dequeue needs no lookup, and the
  running count is kept under ``|<scope>`` so runs started under an older cap still count after
  a deploy changes it;
- ``r|<scope>``: runs of ``concurrency="replace"`` (a new run drops the flow's waiting ones);
- ``o`` + any of these (``ot|<tenant>``, ``oc<cap>|<scope>``): the same flow kept in priority
  order instead of FIFO, for the runs of Django tasks (a sorted set, lua/flow_store.lua): a
  higher ``priority`` is served first, equal priorities in the order they were queued. Priority
  orders runs inside one flow only; the ring still serves flows (tenants) in turn.

Limit keys name counters of queued+running runs (skip gates): ``m|<job>|<tenant>`` for
``max_per_tenant`` skip, ``k|<scope>`` for ``concurrency="skip"``. A scope is ``<job>|<tenant>``
(``concurrency_scope="tenant"``) or ``<job>`` (``"job"``).

A flow that holds work has a state in the lane's state hash: ``r`` (in the ring, served) or
``p`` (parked: a capped flow at its cap, out of the ring until a slot frees).

New flows first: a flow that gets work while idle goes to the head of the ring, and a flow the
claims leave empty leaves it. A tenant whose queue never builds up (one run now and then) is so
served at once, ahead of a backlog, as FQ-CoDel serves sparse flows. The price is the same as
there: a backlogged flow waits for as long as idle flows keep arriving, so it gets only what the
sparse ones leave; it starves only when they alone take every worker's capacity. Each capped
(job, tenant) flow is a ring entry of its own, so a tenant with several such jobs backlogged
gets a turn for each.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from typing import NamedTuple

TENANT = "t"
CAPPED = "c"
REPLACE = "r"
MAX_PER_TENANT = "m"
SKIP = "k"
ORDERED = "o"
IN_RING = "r"
PARKED = "p"
_CAPPED_RE = re.compile(rf"^{ORDERED}?{CAPPED}(\d+)(\|.*)$")


class Limit(NamedTuple):
    """A skip gate: at most ``limit`` queued+running runs counted under ``key``."""

    key: str
    limit: int
    reason: str  # reported as DispatchResult.reason when the gate refuses


def scope(job_name: str, tenant_id: str | None, concurrency_scope: str) -> str:
    """The key ``sequential``/``skip``/``replace``/``debounce`` serialise on."""
    return f"{job_name}|{tenant_id or ''}" if concurrency_scope == "tenant" else job_name


def tenant_flow(tenant_id: str | None) -> str:
    return f"{TENANT}|{tenant_id or ''}"


def capped_flow(cap: int, scope_key: str) -> str:
    return f"{CAPPED}{cap}|{scope_key}"


def replace_flow(scope_key: str) -> str:
    return f"{REPLACE}|{scope_key}"


def ordered_flow(flow: str) -> str:
    """The priority-ordered variant of ``flow`` (its cap and scope unchanged)."""
    return flow if is_ordered(flow) else ORDERED + flow


def is_ordered(flow: str) -> bool:
    return flow.startswith(ORDERED)


def max_per_tenant_limit(job_name: str, tenant_id: str, limit: int) -> Limit:
    return Limit(f"{MAX_PER_TENANT}|{job_name}|{tenant_id}", limit, "max_per_tenant")


def skip_limit(scope_key: str) -> Limit:
    return Limit(f"{SKIP}|{scope_key}", 1, "concurrency")


def cap_of(flow: str) -> tuple[int, str] | None:
    """(cap, running-count field) of a capped flow, None for any other flow."""
    match = _CAPPED_RE.match(flow)
    return (int(match[1]), match[2]) if match else None


# tenant_of_flow() of a flow whose runs span tenants (concurrency_scope="job").
ANY_TENANT = "*"


def tenant_of_flow(flow: str, job_names: Collection[str]) -> str | None:
    """The tenant whose runs wait in ``flow`` (None: runs without a tenant; ``ANY_TENANT``:
    a job-scoped flow, or one of a job this deploy does not know)."""
    kind, _, rest = flow.partition("|")
    if kind == TENANT:
        return rest or None
    if not (kind == REPLACE or _CAPPED_RE.match(flow)):
        return ANY_TENANT
    # rest is a scope: "<job>" or "<job>|<tenant>"; job names may contain "|" themselves.
    if rest in job_names:
        return ANY_TENANT
    for index, char in enumerate(rest):
        if char == "|" and rest[:index] in job_names:
            return rest[index + 1 :] or None
    return ANY_TENANT


def join_keys(limits: Iterable[Limit]) -> str:
    """Limit keys as they travel in the job hash (``kumiko_lk``) and in script arguments."""
    return "\n".join(limit.key for limit in limits)


def join_values(limits: Iterable[Limit]) -> str:
    return "\n".join(str(limit.limit) for limit in limits)


# The same grammar for the Lua scripts (prepended to every script by scripts.py).
LUA_GRAMMAR = rf"""
local NO_TENANT_FLOW = '{TENANT}|'
local IN_RING, PARKED = '{IN_RING}', '{PARKED}'

local function is_ordered(flow)
  return string.sub(flow, 1, 1) == '{ORDERED}'
end

local function cap_of(flow)
  local kind = string.sub(flow, 1, 1)
  if kind == '{ORDERED}' then return tonumber(string.match(flow, '^{ORDERED}{CAPPED}(%d+)|')) end
  if kind ~= '{CAPPED}' then return nil end
  return tonumber(string.match(flow, '^{CAPPED}(%d+)|'))
end

-- Running-count field of a capped flow: its scope without the cap (see flows.py).
local function counter_of(flow)
  return string.match(flow, '^{ORDERED}?{CAPPED}%d+(|.*)$')
end

local function each_line(text)
  return string.gmatch(text or '', '[^\n]+')
end
"""
