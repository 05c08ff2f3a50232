"""Every Redis key and RQ queue name kumiko_jobs uses, derived from ``QUEUE_PREFIX`` in one place.

RQ's own structures (job hashes, queue lists, registries) keep RQ's layout so django-rq's
dashboard and RQ tooling keep working; their names carry the prefix through the queue name
(``rq:queue:<prefix>:<lane>``) or the job id (``<tag>-<hex>``). Our own keys live under
``<prefix>:``. The Lua scripts build a lane's keys from its prefix with the helpers of
``LUA_KEY_HELPERS``, generated from the suffixes below, so the names exist only here.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property

from kumiko_jobs.definitions import LANES

__all__ = ["LANES", "LUA_KEY_HELPERS", "Keys"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_]")

# RQ's global set of queue keys (django-rq's dashboard lists queues from it).
RQ_QUEUES = "rq:queues"
# RQ's global set of registered workers' keys (rq:worker:<name>).
RQ_WORKERS = "rq:workers"
RQ_JOB_PREFIX = "rq:job:"

# Suffixes of a lane's fair-queue keys, after the lane prefix "<prefix>:<lane>:".
FLOW_SUFFIX = "q:"  # + flow name: the FIFO list of one flow's queued job ids
STATE_SUFFIX = "st"  # hash flow -> state of flows that hold work (see flows.py)
RUNNING_SUFFIX = "run"  # hash counter key -> running runs of capped flows
RING_SUFFIX = "ring"  # list of flows eligible to be served, head first
WAKE_SUFFIX = "wake"  # token list idle workers block on
# Hourly outcome counters of a lane (+ the hour number, unix time // 3600), kept STATS_TTL:
STATS_SUFFIX = "stats:"  # hash: <outcome> and j|<job>|<outcome> -> attempts that ended so
SUCCEEDING_SUFFIX = "tok:"  # sorted set: tenant -> succeeded runs
FAILING_SUFFIX = "tfail:"  # sorted set: tenant -> final failures
NO_TENANT = "-"  # the tenant field of runs without a tenant
STATS_TTL = 26 * 3600  # 24 full hours and the current one, with a margin
BROKEN_SUFFIX = "broken"  # set of flows whose key had the wrong Redis type (moved aside to <this>:<flow>)
QUEUED_SUFFIX = "queued"  # count of ids in the lane's flows (depth metric: O(1) per lane)
SEQUENCE_SUFFIX = "seq"  # counter ordering equal priorities in ordered flows (flow_store.lua)


def started_job_id(member: str | bytes) -> str:
    """The job id of a member of a lane's started registry (``Keys.started``): RQ files a
    claimed job there as ``job_id:execution_id``."""
    text = member.decode() if isinstance(member, bytes) else member
    return text.split(":", 1)[0]


LUA_KEY_HELPERS = f"""
local function job_key(id) return '{RQ_JOB_PREFIX}' .. id end
-- RQ's structures of a queue (keys.Keys.queue/scheduled/failed/finished/started).
local function rq_key(kind, queue) return 'rq:' .. kind .. ':' .. queue end
local function flow_key(P, flow) return P .. '{FLOW_SUFFIX}' .. flow end
local function state_key(P) return P .. '{STATE_SUFFIX}' end
local function running_key(P) return P .. '{RUNNING_SUFFIX}' end
local function ring_key(P) return P .. '{RING_SUFFIX}' end
local function wake_key(P) return P .. '{WAKE_SUFFIX}' end
local function stats_key(P, hour) return P .. '{STATS_SUFFIX}' .. hour end
local function succeeding_key(P, hour) return P .. '{SUCCEEDING_SUFFIX}' .. hour end
local function failing_key(P, hour) return P .. '{FAILING_SUFFIX}' .. hour end
local NO_TENANT, STATS_TTL = '{NO_TENANT}', {STATS_TTL}
local function broken_key(P) return P .. '{BROKEN_SUFFIX}' end
local function queued_key(P) return P .. '{QUEUED_SUFFIX}' end
local function sequence_key(P) return P .. '{SEQUENCE_SUFFIX}' end
"""


@dataclass(frozen=True)
class Keys:
    prefix: str

    @cached_property
    def id_tag(self) -> str:
        """Job-id prefix: RQ ids allow only [A-Za-z0-9_-] and live in one global namespace."""
        tag = _UNSAFE.sub("_", self.prefix)
        if tag != self.prefix:
            # Keep 'a:b' and 'a_b' apart after sanitising.
            tag += "_" + hashlib.sha1(self.prefix.encode(), usedforsecurity=False).hexdigest()[:6]
        return tag

    def queue_name(self, lane: str) -> str:
        return f"{self.prefix}:{lane}"

    def lane_of_queue(self, queue_name: str) -> str | None:
        """The lane whose RQ queue name this is under this prefix, or None."""
        return next((lane for lane in LANES if self.queue_name(lane) == queue_name), None)

    # RQ structures of a lane -------------------------------------------------------------
    def queue(self, lane: str) -> str:
        return f"rq:queue:{self.queue_name(lane)}"

    def started(self, lane: str) -> str:
        return f"rq:wip:{self.queue_name(lane)}"

    def finished(self, lane: str) -> str:
        return f"rq:finished:{self.queue_name(lane)}"

    def failed(self, lane: str) -> str:
        return f"rq:failed:{self.queue_name(lane)}"

    def scheduled(self, lane: str) -> str:
        return f"rq:scheduled:{self.queue_name(lane)}"

    def outcome_registries(self, lane: str) -> list[str]:
        """KEYS of the scripts that finish attempts: started, finished, failed, scheduled, and
        the active-limits hash (lua/finish_and_claim.lua, lua/reap.lua)."""
        return [self.started(lane), self.finished(lane), self.failed(lane), self.scheduled(lane), self.active]

    @staticmethod
    def job(job_id: str) -> str:
        return f"{RQ_JOB_PREFIX}{job_id}"

    @staticmethod
    def worker(name: str) -> str:
        return f"rq:worker:{name}"

    # A lane's fair queue ------------------------------------------------------------------
    def lane(self, lane: str) -> str:
        """Prefix of a lane's fair-queue keys (flows, state, running counts, ring, wake)."""
        return f"{self.prefix}:{lane}:"

    def flow(self, lane: str, flow: str) -> str:
        return f"{self.lane(lane)}{FLOW_SUFFIX}{flow}"

    def flow_states(self, lane: str) -> str:
        return f"{self.lane(lane)}{STATE_SUFFIX}"

    def running(self, lane: str) -> str:
        return f"{self.lane(lane)}{RUNNING_SUFFIX}"

    def ring(self, lane: str) -> str:
        return f"{self.lane(lane)}{RING_SUFFIX}"

    def wake(self, lane: str) -> str:
        return f"{self.lane(lane)}{WAKE_SUFFIX}"

    def stop_wake(self, lane: str, worker: str) -> str:
        """One worker's own token list, which its idle claimer blocks on beside the lane's wake
        list: the worker pushes to it when it stops (claiming.Claimer.stop_waiting)."""
        return f"{self.wake(lane)}:{worker}"

    def stats(self, lane: str, hour: int) -> str:
        """Hash of a lane's attempt outcomes in one hour, overall and per job."""
        return f"{self.lane(lane)}{STATS_SUFFIX}{hour}"

    def succeeding_tenants(self, lane: str, hour: int) -> str:
        """Sorted set of a lane's tenants by succeeded runs in one hour."""
        return f"{self.lane(lane)}{SUCCEEDING_SUFFIX}{hour}"

    def failing_tenants(self, lane: str, hour: int) -> str:
        """Sorted set of a lane's tenants by final failures in one hour."""
        return f"{self.lane(lane)}{FAILING_SUFFIX}{hour}"

    def broken_flows(self, lane: str) -> str:
        return f"{self.lane(lane)}{BROKEN_SUFFIX}"

    def queued_count(self, lane: str) -> str:
        """How many ids the lane's flows hold, kept by the lane scripts (count_queued)."""
        return f"{self.lane(lane)}{QUEUED_SUFFIX}"

    def sequence(self, lane: str) -> str:
        return f"{self.lane(lane)}{SEQUENCE_SUFFIX}"

    # Our own keys ------------------------------------------------------------------------
    @property
    def active(self) -> str:
        """Hash of queued+running counts per limit key (skip limits), across both lanes."""
        return f"{self.prefix}:active"

    def debounce(self, scope_key: str) -> str:
        return f"{self.prefix}:debounce:{scope_key}"

    def claimers(self, lane: str) -> str:
        """Set of worker names consuming this lane (for operators and tests)."""
        return f"{self.prefix}:{lane}:claimers"

    def reaper_lock(self, lane: str) -> str:
        return f"{self.prefix}:{lane}:reaper"

    def repair_lock(self, lane: str) -> str:
        return f"{self.prefix}:{lane}:repair-lock"

    def repair_mark(self, lane: str) -> str:
        """Where the stale-run repair resumes: ``<updated_at iso>|<run pk>``."""
        return f"{self.prefix}:{lane}:repair-mark"

    @property
    def epoch(self) -> str:
        """A random value set once per Redis dataset: gone or changed means Redis lost its data."""
        return f"{self.prefix}:epoch"

    def rebuilt(self, lane: str) -> str:
        """The epoch this lane was last rebuilt from records for (rebuild.py)."""
        return f"{self.prefix}:{lane}:rebuilt"

    def rebuild_state(self, lane: str) -> str:
        return f"{self.prefix}:{lane}:rebuild-state"

    def rebuild_lock(self, lane: str) -> str:
        return f"{self.prefix}:{lane}:rebuild-lock"

    def suspects(self, lane: str, task: str) -> str:
        """Sorted set of runs a task (outbox, rebuild, repair) found missing from Redis, pushed
        again once confirmed (suspects.py): ``<run pk>|<updated_at iso>`` -> when noted."""
        return f"{self.prefix}:{lane}:suspects:{task}"

    def outbox_lock(self, lane: str) -> str:
        return f"{self.prefix}:{lane}:outbox-lock"

    def audit_window(self, job_name: str, tenant_id: str, kind: str, window_start: int) -> str:
        """Set by the process that inserts an escape-hatch audit row for this window."""
        return f"{self.prefix}:audit:{job_name}:{tenant_id}:{kind}:{window_start}"

    # Schedules (kumiko_jobs/scheduling) ------------------------------------------------------
    def scheduler_lease(self, lane: str) -> str:
        """The lane's scheduler lease: "<epoch>|<owner>" of the process that fires its ticks."""
        return f"{self.prefix}:{lane}:sched:lease"

    def scheduler_epoch(self, lane: str) -> str:
        """Counter incremented per lease acquisition (the fencing token's epoch)."""
        return f"{self.prefix}:{lane}:sched:epoch"

    def schedules_seen(self, lane: str) -> str:
        """Sorted set schedule id -> when a live process last declared it."""
        return f"{self.prefix}:{lane}:sched:seen"

    def schedule_cursor(self, lane: str, schedule_id: str) -> str:
        """Hash zone -> UTC time (epoch s) of the last tick handled (fired or skipped)."""
        return f"{self.prefix}:{lane}:sched:cursor:{schedule_id}"

    @property
    def boot_marks(self) -> str:
        """Hash "<release>|<job>" -> when its run_on_boot dispatch happened."""
        return f"{self.prefix}:boot"

    @property
    def tenant_zones_generation(self) -> str:
        """The current generation of the tenant zone index."""
        return f"{self.prefix}:tz:gen"

    @property
    def tenant_zones_lock(self) -> str:
        return f"{self.prefix}:tz:lock"

    def tenant_zones(self, generation: int) -> str:
        """Hash zone -> number of tenants in it, of one index generation."""
        return f"{self.prefix}:tz:{generation}:zones"

    def tenant_zone_members(self, generation: int, zone: str) -> str:
        """List of the tenant ids in one zone, of one index generation."""
        return f"{self.prefix}:tz:{generation}:z:{zone}"
