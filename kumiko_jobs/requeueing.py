"""Put finished, failed or canceled runs back in their flows: the operators' "requeue".

Stock RQ's requeue pushes the id onto the plain RQ list, where kumiko's sweep would route it
into its flow without taking its skip limits again, so the run's end would release them a
second time. This script does the whole step atomically per job instead: take the limits
again (refusing the job when a limit is full, as dispatch would), take it out of RQ's failed,
finished and canceled registries, clear its expiry and push it into its flow. A scheduled job
(a retry or deferral waiting for its time) still holds its limits and is just moved up.
The run repeats its last attempt; its row goes back to ``queued``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache

import redis
from redis.commands.core import Script
from rq.utils import as_text, utcformat

from kumiko_jobs import records
from kumiko_jobs.connection import get_keys, get_redis
from kumiko_jobs.exceptions import MalformedJob
from kumiko_jobs.gates import gates_for
from kumiko_jobs.jobdata import JobMeta
from kumiko_jobs.keys import LANES
from kumiko_jobs.registry import registry
from kumiko_jobs.scripts import _COMMON as COMMON_LUA

logger = logging.getLogger("kumiko_jobs")
BATCH = 200

# KEYS: 1 active-limits hash. ARGV: 1, 2 the lanes' queue names, 3 now_iso, then per job:
# id, limits ("\n"-joined, one per key of the job's kumiko_lk; 0 = no check).
# Returns one code per job: 'q' requeued, 'n' no such job, 'o' not ours, 's<i>' the i-th
# limit is full, else the job's status (queued or running: refused).
REQUEUE = (
    COMMON_LUA
    + r"""
local origins = {[ARGV[1]] = true, [ARGV[2]] = true}
local finished = {finished = true, failed = true, canceled = true, stopped = true}
local out = {}
for base = 4, #ARGV, 2 do
  local id = ARGV[base]
  local jk = 'rq:job:' .. id
  local f = redis.call('HMGET', jk, 'status', 'origin', 'kumiko_flow', 'kumiko_lk')
  local status, origin, flow, lk = f[1], f[2], f[3], f[4]
  local code = nil
  if not status then
    code = 'n'
  elseif not origin or not origins[origin] or not flow then
    code = 'o'
  elseif status == 'scheduled' then
    redis.call('ZREM', 'rq:scheduled:' .. origin, id)
  elseif finished[status] then
    local limits = {}
    for v in string.gmatch(ARGV[base + 1], '[^\n]+') do limits[#limits + 1] = tonumber(v) end
    local i, taken = 0, {}
    for key in string.gmatch(lk or '', '[^\n]+') do
      i = i + 1
      local limit = limits[i] or 0
      if redis.call('HINCRBY', KEYS[1], key, 1) > limit and limit > 0 then
        redis.call('HINCRBY', KEYS[1], key, -1)
        for _, k in ipairs(taken) do redis.call('HINCRBY', KEYS[1], k, -1) end
        code = 's' .. i
        break
      end
      taken[#taken + 1] = key
    end
    if not code then
      for _, registry in ipairs({'failed', 'finished', 'canceled'}) do
        redis.call('ZREM', 'rq:' .. registry .. ':' .. origin, id)
      end
      redis.call('PERSIST', jk)
    end
  else
    code = status
  end
  if not code then
    redis.call('HSET', jk, 'status', 'queued', 'enqueued_at', ARGV[3])
    push_flow(origin .. ':', flow, id, false)
    code = 'q'
  end
  out[#out + 1] = code
end
return out
"""
)


@dataclass(frozen=True)
class RequeueResult:
    """Which jobs went back to their flows, and why the others did not (job id -> reason)."""

    requeued: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)


def requeue_jobs(job_ids: Iterable[str], *, client: redis.Redis | None = None) -> RequeueResult:
    """Requeue these jobs if they are finished, failed, canceled or scheduled; see the module doc."""
    client = client or get_redis()
    keys = get_keys()
    ids = list(dict.fromkeys(job_ids))
    requeued: list[str] = []
    refused: dict[str, str] = {}
    now = datetime.now(UTC)
    for start in range(0, len(ids), BATCH):
        batch = ids[start : start + BATCH]
        limits = _limits_of(client, batch)
        args: list[str] = []
        for job_id, job_limits in zip(batch, limits, strict=True):
            args += [job_id, "\n".join(str(limit) for limit, _ in job_limits)]
        codes = _script(client)(
            keys=[keys.active], args=[*(keys.queue_name(lane) for lane in LANES), utcformat(now), *args]
        )
        for job_id, job_limits, raw in zip(batch, limits, codes, strict=True):
            code = raw.decode()
            if code == "q":
                requeued.append(job_id)
            elif code.startswith("s"):
                refused[job_id] = f"its {job_limits[int(code[1:]) - 1][1]} limit is full"
            else:
                refused[job_id] = {"n": "no such job", "o": "not a kumiko_jobs job of these lanes"}.get(
                    code, f"it is {code}"
                )
    if requeued:
        records.safe(records.mark_requeued_by_operator, requeued, now=now)
        logger.info("kumiko_jobs: requeued %d job(s) by operator request", len(requeued))
    return RequeueResult(tuple(requeued), refused)


def _limits_of(client: redis.Redis, job_ids: list[str]) -> list[list[tuple[int, str]]]:
    """Per job, (limit, reason) for each key of its stored limit keys, from its declaration;
    0 (no check) where the declaration is gone or no longer has that limit."""
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(get_keys().job(job_id), "meta", "kumiko_lk")
    out: list[list[tuple[int, str]]] = []
    for meta_raw, lk in pipe.execute():
        stored = [key for key in as_text(lk or b"").split("\n") if key]
        declared: dict[str, tuple[int, str]] = {}
        try:
            meta = JobMeta.from_json(meta_raw) if meta_raw else None
        except MalformedJob:
            meta = None
        definition = registry.find(meta.job_name) if meta else None
        if meta and definition:
            gates = gates_for(definition, meta.tenant_id, get_keys())
            declared = {key: (limit, reason) for key, limit, reason in gates.limits}
        out.append([declared.get(key, (0, "")) for key in stored])
    return out


@cache
def _script(client: redis.Redis) -> Script:
    return client.register_script(REQUEUE)
