"""Cancel queued (or scheduled) runs: the operators' "delete" in django-rq's dashboard and the
admin console.

One script call per batch does, for each job that is still waiting: take it out of its flow
(or the scheduled set, or RQ's plain list if stock RQ pushed it there), give back its skip
limits once, and set its hash to ``canceled``. A job already claimed by a worker is refused, so a
run's limits and cap slot are released exactly once: by the cancel or by the worker, never
both (a capped flow's slot is taken at claim, so a waiting run holds none). The run rows
become ``dropped``; if that write fails, stale-run repair reads ``canceled`` from Redis and
drops them later (the hash is kept for a day for that).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache

import redis
from redis.commands.core import Script
from rq.utils import utcformat

from kumiko_jobs import records
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.keys import LANES
from kumiko_jobs.scripts import _COMMON as COMMON_LUA

logger = logging.getLogger("kumiko_jobs")

# Long enough for stale-run repair to read the status of a run whose row write failed.
CANCELED_TTL = 86400
BATCH = 500

# KEYS: 1 active-limits hash. ARGV: 1, 2 the lanes' queue names (a job of another prefix is
# refused), 3 now_iso, 4 ttl, then job ids. Returns one code per id: 'c' canceled, 'n' no such
# job, 'o' not a kumiko job of these lanes, else the job's status (not waiting: refused).
CANCEL = (
    COMMON_LUA
    + r"""
local origins = {[ARGV[1]] = true, [ARGV[2]] = true}
local out = {}
for i = 5, #ARGV do
  local id = ARGV[i]
  local jk = 'rq:job:' .. id
  local f = redis.call('HMGET', jk, 'status', 'origin', 'kumiko_flow', 'kumiko_lk')
  local status, origin, flow = f[1], f[2], f[3]
  if not status then
    out[#out + 1] = 'n'
  elseif not origin or not origins[origin] or not flow then
    out[#out + 1] = 'o'
  elseif status == 'queued' or status == 'scheduled' then
    local P = origin .. ':'
    if status == 'scheduled' then
      redis.call('ZREM', 'rq:scheduled:' .. origin, id)
    elseif redis.call('LREM', P .. 'q:' .. flow, 1, id) == 0 then
      redis.call('LREM', 'rq:queue:' .. origin, 1, id)  -- pushed by stock RQ, not swept yet
    end
    -- A parked flow left empty is forgotten; a ringed one is dropped by the next claim (O(1)).
    if redis.call('HGET', P .. 'st', flow) == 'p' and redis.call('LLEN', P .. 'q:' .. flow) == 0 then
      redis.call('HDEL', P .. 'st', flow)
    end
    forget_limits(KEYS[1], f[4])
    redis.call('HSET', jk, 'status', 'canceled', 'ended_at', ARGV[3])
    redis.call('EXPIRE', jk, ARGV[4])
    out[#out + 1] = 'c'
  else
    out[#out + 1] = status
  end
end
return out
"""
)

_REFUSALS = {
    "n": "no such job",
    "o": "not a kumiko_jobs job of this project's lanes",
    "started": "running: a worker has it",
}


@dataclass(frozen=True)
class CancelResult:
    """Which jobs were canceled, and why the others were not (job id -> reason)."""

    canceled: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)
    # False when the run rows could not be marked dropped (repair will do it).
    recorded: bool = True


def cancel_queued(
    job_ids: Iterable[str], *, reason: str = "Canceled by an operator.", client: redis.Redis | None = None
) -> CancelResult:
    """Cancel these jobs if they are still waiting (queued or scheduled); see the module doc."""
    client = client or get_redis()
    keys = get_keys()
    ids = list(dict.fromkeys(job_ids))
    canceled: list[str] = []
    refused: dict[str, str] = {}
    now = datetime.now(UTC)
    for start in range(0, len(ids), BATCH):
        batch = ids[start : start + BATCH]
        codes = _script(client)(
            keys=[keys.active],
            args=[*(keys.queue_name(lane) for lane in LANES), utcformat(now), CANCELED_TTL, *batch],
        )
        for job_id, raw in zip(batch, codes, strict=True):
            code = raw.decode()
            if code == "c":
                canceled.append(job_id)
            else:
                refused[job_id] = _REFUSALS.get(code, f"already {code}")
    recorded = True
    if canceled:
        recorded = records.safe(records.mark_dropped, canceled, now=now, reason=reason)
        logger.info("kumiko_jobs: canceled %d queued job(s): %s", len(canceled), _sample(canceled))
    return CancelResult(tuple(canceled), refused, recorded)


def _sample(ids: Sequence[str]) -> str:
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


@cache
def _script(client: redis.Redis) -> Script:
    return client.register_script(CANCEL)
