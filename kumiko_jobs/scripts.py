"""Lua scripts: every multi-key state change of a lane is one atomic script call.

The scripts live in ``lua/``; each is prepended with the key helpers (keys.py), the flow
grammar (flows.py) and the shared helpers (``lua/common.lua``), and loaded once per client.
Each script's ARGV is built from the ``NamedTuple`` named in its header: the field order is the
contract, and the script binds ARGV to locals of the same names on its first lines.

Flows, the ring and parking are described in flows.py. Job hashes keep RQ's layout; ids that
stock RQ code pushes onto the plain RQ list (scheduler, dashboard "requeue") are swept into
their flows. Keys are built inside the scripts from the lane prefix passed in ARGV; like RQ
itself this does not support Redis Cluster.

One-letter codes:
- enqueue results: ``q`` queued, ``d`` duplicate id (unique push), ``s`` refused by a skip
  limit, ``b`` merged into a pending debounced run, ``r`` a late push of a replace job refused
  because a newer run of its flow waits;
- attempt outcomes (``OutcomeKind``): ``ok`` succeeded, ``failed`` failed finally, ``retry``
  scheduled again at ``retry_at``, ``requeue`` back in its flow at once, ``return`` first in its
  flow again (claimed, never started: a stopping worker's ready jobs).
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any, NamedTuple

import redis
from redis.commands.core import Script

from kumiko_jobs.flows import LUA_GRAMMAR
from kumiko_jobs.keys import LUA_KEY_HELPERS


class EnqueueArgs(NamedTuple):
    """ARGV of lua/enqueue.lua; the job hash's field/value pairs follow."""

    unique: str  # '1': refuse an id that exists
    run_at: float  # 0 = queue now, else the scheduled time
    lane_prefix: str
    flow: str
    limit_keys: str  # "\n"-joined (flows.join_keys)
    limits: str  # same order (flows.join_values)
    replace: str  # '1': drop the flow's waiting ids first
    debounce_key: str
    debounce_seconds: float
    now: float
    restore: str  # '1': a lost hash of a run that may still wait in its flow (no second entry)
    late: str  # '1': pushed from its record (outbox, rebuild): a newer run waiting in a replace flow wins


class Ending(NamedTuple):
    """How an attempt ended, as the common.lua ``finish`` helper takes it: the trailing ARGV of
    lua/finish_and_claim.lua and lua/reap.lua (``ending(ARGV, first)`` unpacks it there)."""

    kind: str  # OutcomeKind, '' when nothing finished
    ttl: int
    retry_at: float
    meta: str  # new job meta ('' keeps it)
    exc_info: bytes
    flow: str  # the run's flow (frees its cap slot)
    limit_keys: str  # the run's skip limits
    current_flow: str  # the job's flow under this deploy, when a deploy changed it ('')


class FinishAndClaimArgs(NamedTuple):
    """ARGV of lua/finish_and_claim.lua. Then follow ``finished`` entries of (job id, its lease
    member in the started registry, an Ending), ``claims`` execution ids, and ``counts`` entries
    of ended-attempt counts (hour, outcome, count, job, tenant: outcome_counts.py)."""

    now: float
    now_iso: str
    worker: str
    deadline: float  # lease of the claimed runs
    lane_prefix: str
    finished: int
    claims: int
    counts: int
    # 1: the same call again after its outcome was lost (a timeout or a dropped connection after
    # it was sent): claims the first one made under these execution ids are returned instead of
    # claiming more (lua/finish_and_claim.lua).
    again: int = 0


class PromoteArgs(NamedTuple):
    now: float
    limit: int
    now_iso: str
    lane_prefix: str


class HeartbeatArgs(NamedTuple):
    """ARGV of lua/heartbeat.lua; the running jobs' lease members follow."""

    deadline: float
    worker_ttl: int
    now_iso: str


class ReapArgs(NamedTuple):
    """ARGV of lua/reap.lua: an abandoned run's lease member; an Ending follows."""

    now: float
    now_iso: str
    member: str
    job_id: str
    lane_prefix: str


class CancelArgs(NamedTuple):
    """ARGV of lua/cancel.lua; job ids follow."""

    api_queue: str  # the lanes' queue names: a job of another prefix is refused
    worker_queue: str
    now_iso: str
    ttl: int  # how long a canceled hash is kept (repair reads it)


class RequeueArgs(NamedTuple):
    """ARGV of lua/requeue.lua; (job id, limits) pairs follow."""

    api_queue: str
    worker_queue: str
    now_iso: str


def _source(name: str) -> str:
    return files("kumiko_jobs").joinpath("lua", f"{name}.lua").read_text()


@cache
def _lane_script(name: str) -> str:
    return "\n".join((LUA_KEY_HELPERS, LUA_GRAMMAR, _source("flow_store"), _source("common"), _source(name)))


class LaneScripts:
    """The scripts registered on one client (redis-py loads them on first use, and again after
    a Redis restart)."""

    def __init__(self, client: redis.Redis) -> None:
        self.enqueue: Script = client.register_script(_lane_script("enqueue"))
        self.enqueue_many: Script = client.register_script(_lane_script("enqueue_many"))
        self.finish_and_claim: Script = client.register_script(_lane_script("finish_and_claim"))
        self.promote: Script = client.register_script(_lane_script("promote"))
        self.heartbeat: Script = client.register_script(_source("heartbeat"))
        self.reap: Script = client.register_script(_lane_script("reap"))
        self.reaper_turn: Script = client.register_script(_source("reaper_turn"))
        self.zone_switch: Script = client.register_script(_source("zone_switch"))
        self.cancel: Script = client.register_script(_lane_script("cancel"))
        self.requeue: Script = client.register_script(_lane_script("requeue"))


@cache
def scripts_for(client: redis.Redis) -> LaneScripts:
    return LaneScripts(client)


def argv(args: NamedTuple, *rest: Any) -> list[Any]:
    """A script's ARGV: its argument tuple in field order, then any trailing items."""
    return [*args, *rest]
