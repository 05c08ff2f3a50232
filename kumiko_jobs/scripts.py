"""Lua scripts: every multi-key state change of a lane is one atomic script call.

A lane keeps its queued job ids in *flows*: one FIFO list per tenant (``t|<tenant>``), or per
capped key (``c<cap>|<job>|<tenant>`` for ``max_per_tenant`` defer and ``sequential``, whose
cap is part of the name so no lookup is needed), or per replace key (``r|...``). A ring lists
the flows that have work and are under their cap; a worker serves the ring head, pops one id
and rotates, so every dequeue is O(1) whatever the number of tenants, and a capped flow is
parked (taken out of the ring) instead of being popped and put back. Flows that turn active
go to the head of the ring ("new flows first"), so a quiet tenant is served next even behind
thousands of busy ones. Job hashes keep RQ's layout, and ids that stock RQ code pushes onto
the plain RQ list (scheduler, dashboard "requeue") are swept into their flows.

Keys are built inside the scripts from the lane prefix passed in ARGV; like RQ itself this
does not support Redis Cluster.
"""

from __future__ import annotations

from functools import cache

import redis
from redis.commands.core import Script

# Shared helpers. P = lane prefix ("<prefix>:<lane>:").
_COMMON = r"""
local function cap_of(flow)
  if string.sub(flow, 1, 1) ~= 'c' then return nil end
  return tonumber(string.match(flow, '^c(%d+)|'))
end

-- Running count field of a capped flow: the key without the cap, so runs started under an
-- older cap still count when the cap changes (a deploy lowers it).
local function counter_of(flow)
  return string.match(flow, '^c%d+(|.*)$')
end

local function arm(P)
  if redis.call('LLEN', P .. 'wake') == 0 then redis.call('RPUSH', P .. 'wake', '1') end
end

-- Append an id to its flow and make the flow eligible if it was idle.
local function push_flow(P, flow, id, front)
  if front then redis.call('LPUSH', P .. 'q:' .. flow, id) else redis.call('RPUSH', P .. 'q:' .. flow, id) end
  if not redis.call('HGET', P .. 'st', flow) then
    local cap = cap_of(flow)
    if cap and tonumber(redis.call('HGET', P .. 'run', counter_of(flow)) or '0') >= cap then
      redis.call('HSET', P .. 'st', flow, 'p')
    else
      -- New flows first: an idle flow that gets work is served next.
      redis.call('LPUSH', P .. 'ring', flow)
      redis.call('HSET', P .. 'st', flow, 'r')
      arm(P)
    end
  end
end

-- Ids pushed onto the plain RQ list by stock RQ code: route them to their flows.
local function sweep(P, plain, max)
  local n = 0
  for _ = 1, max do
    local id = redis.call('LPOP', plain)
    if not id then break end
    local flow = redis.call('HGET', 'rq:job:' .. id, 'kumiko_flow') or 't|'
    redis.call('HSET', 'rq:job:' .. id, 'status', 'queued')
    push_flow(P, flow, id, false)
    n = n + 1
  end
  return n
end

-- Put a parked capped flow back in the ring when its (job, tenant) is below the cap again.
local function unpark(P, flow)
  local cap = cap_of(flow)
  if not cap or redis.call('HGET', P .. 'st', flow) ~= 'p' then return end
  if tonumber(redis.call('HGET', P .. 'run', counter_of(flow)) or '0') >= cap then return end
  if redis.call('LLEN', P .. 'q:' .. flow) > 0 then
    redis.call('RPUSH', P .. 'ring', flow)
    redis.call('HSET', P .. 'st', flow, 'r')
    arm(P)
  else
    redis.call('HDEL', P .. 'st', flow)
  end
end

-- A capped flow's slot frees: count it and unpark the flow (and the job's current flow, if a
-- deploy changed the cap since this run was queued).
local function release(P, flow, current)
  if not cap_of(flow) then return end
  local running = redis.call('HINCRBY', P .. 'run', counter_of(flow), -1)
  if running <= 0 then redis.call('HDEL', P .. 'run', counter_of(flow)) end
  unpark(P, flow)
  if current and current ~= '' and current ~= flow then unpark(P, current) end
end

local function forget_limits(active, lk)
  if not lk or lk == '' then return end
  for key in string.gmatch(lk, '[^\n]+') do
    if redis.call('HINCRBY', active, key, -1) <= 0 then redis.call('HDEL', active, key) end
  end
end
"""

# Admit and queue (or schedule) one job atomically with its gates.
# KEYS: 1 job hash, 2 scheduled zset, 3 active-limits hash.
# ARGV: 1 unique, 2 run_at (0 = now), 3 lane prefix, 4 flow, 5 limit keys ("\n"-joined),
#       6 limits (same order), 7 replace ('1' drops the flow's waiting ids), 8 debounce key,
#       9 debounce seconds, 10 now, then field/value pairs of the job hash.
# Returns {'q', dropped ids...} | {'d'} duplicate | {'s', index of the limit that fired}
#       | {'b', id of the pending debounced job}.
ENQUEUE = (
    _COMMON
    + r"""
local id = string.sub(KEYS[1], 8)
if ARGV[1] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then return {'d'} end
local P = ARGV[3]
if ARGV[8] ~= '' then
  local pending = redis.call('GET', ARGV[8])
  if pending and redis.call('HGET', 'rq:job:' .. pending, 'status') == 'scheduled' then
    -- Trailing-edge debounce: the pending run takes the newest payload and waits again.
    for i = 11, #ARGV, 2 do
      if ARGV[i] == 'data' or ARGV[i] == 'description' then
        redis.call('HSET', 'rq:job:' .. pending, ARGV[i], ARGV[i + 1])
      end
    end
    redis.call('ZADD', KEYS[2], tonumber(ARGV[10]) + tonumber(ARGV[9]), pending)
    return {'b', pending}
  end
end
local limits = {}
for v in string.gmatch(ARGV[6], '[^\n]+') do limits[#limits + 1] = tonumber(v) end
local i = 0
local taken = {}
for key in string.gmatch(ARGV[5], '[^\n]+') do
  i = i + 1
  if redis.call('HINCRBY', KEYS[3], key, 1) > limits[i] then
    redis.call('HINCRBY', KEYS[3], key, -1)
    for _, k in ipairs(taken) do redis.call('HINCRBY', KEYS[3], k, -1) end
    return {'s', i}
  end
  taken[#taken + 1] = key
end
local fields = {}
for j = 11, #ARGV do fields[#fields + 1] = ARGV[j] end
redis.call('HSET', KEYS[1], unpack(fields))
local out = {'q'}
local flow = ARGV[4]
if ARGV[7] == '1' then
  local q = P .. 'q:' .. flow
  for _, old in ipairs(redis.call('LRANGE', q, 0, -1)) do
    local ok = 'rq:job:' .. old
    forget_limits(KEYS[3], redis.call('HGET', ok, 'kumiko_lk'))
    redis.call('HSET', ok, 'status', 'canceled')
    redis.call('EXPIRE', ok, 86400)
    out[#out + 1] = old
  end
  redis.call('DEL', q)
end
if ARGV[8] ~= '' then
  redis.call('SET', ARGV[8], id, 'PX', math.floor(tonumber(ARGV[9]) * 2000) + 1000)
end
if tonumber(ARGV[2]) > 0 then
  redis.call('ZADD', KEYS[2], ARGV[2], id)
else
  push_flow(P, flow, id, false)
end
return out
"""
)

# Queue many new jobs that share most fields (a fan-out's children) in one call. No replace or
# debounce gates; skip limits apply per job. KEYS: active-limits hash.
# ARGV: 1 lane prefix, 2 count of shared field/value items, the shared items, then per job:
#       id, meta, description, flow, limit keys, limits.
# Returns one code per job: 'q' queued, 'd' duplicate id, 's' skipped by a limit.
ENQUEUE_MANY = (
    _COMMON
    + r"""
local P = ARGV[1]
local shared_n = tonumber(ARGV[2])
local shared = {}
for i = 3, 2 + shared_n do shared[#shared + 1] = ARGV[i] end
local out = {}
for base = 3 + shared_n, #ARGV, 6 do
  local id, flow, lk = ARGV[base], ARGV[base + 3], ARGV[base + 4]
  local jk = 'rq:job:' .. id
  local code = 'q'
  if redis.call('EXISTS', jk) == 1 then
    code = 'd'
  else
    local limits = {}
    for v in string.gmatch(ARGV[base + 5], '[^\n]+') do limits[#limits + 1] = tonumber(v) end
    local i, taken = 0, {}
    for key in string.gmatch(lk, '[^\n]+') do
      i = i + 1
      if redis.call('HINCRBY', KEYS[1], key, 1) > limits[i] then
        redis.call('HINCRBY', KEYS[1], key, -1)
        for _, k in ipairs(taken) do redis.call('HINCRBY', KEYS[1], k, -1) end
        code = 's'
        break
      end
      taken[#taken + 1] = key
    end
  end
  if code == 'q' then
    redis.call('HSET', jk, 'meta', ARGV[base + 1], 'description', ARGV[base + 2], 'kumiko_flow', flow,
               'kumiko_lk', lk, unpack(shared))
    push_flow(P, flow, id, false)
  end
  out[#out + 1] = code
end
return out
"""
)

# Finish the previous job (optional) and claim the next one (optional), one round trip.
# KEYS: 1 started (wip), 2 finished, 3 failed, 4 scheduled, 5 active-limits hash, 6 plain RQ list.
# ARGV: 1 now, 2 now_iso, 3 worker, 4 lease deadline, 5 finish id, 6 kind (ok|failed|retry|
#       requeue|''), 7 wip member, 8 ttl, 9 retry_at, 10 new meta ('' keeps), 11 exc_info,
#       12 claim ('1'|''), 13 execution id, 14 lane prefix, 15 finished job's flow,
#       16 finished job's limit keys, 17 the job's current flow when a deploy changed it ('').
# Returns {id, data, meta} of the claimed job, or false.
STEP = (
    _COMMON
    + r"""
local now = tonumber(ARGV[1])
local P = ARGV[14]
local fid = ARGV[5]
if fid ~= '' then
  local jk = 'rq:job:' .. fid
  redis.call('ZREM', KEYS[1], ARGV[7])
  local kind = ARGV[6]
  if ARGV[15] ~= '' then release(P, ARGV[15], ARGV[17]) end
  if kind == 'ok' or kind == 'failed' or kind == 'dropped' then forget_limits(KEYS[5], ARGV[16]) end
  if redis.call('EXISTS', jk) == 0 then kind = 'gone' end
  if kind == 'ok' then
    redis.call('HSET', jk, 'status', 'finished', 'ended_at', ARGV[2])
    redis.call('EXPIRE', jk, ARGV[8])
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[8]), fid)
  elseif kind == 'failed' then
    redis.call('HSET', jk, 'status', 'failed', 'ended_at', ARGV[2], 'exc_info', ARGV[11])
    if ARGV[10] ~= '' then redis.call('HSET', jk, 'meta', ARGV[10]) end
    redis.call('EXPIRE', jk, ARGV[8])
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[8]), fid)
  elseif kind == 'retry' then
    redis.call('HSET', jk, 'status', 'scheduled', 'meta', ARGV[10])
    redis.call('ZADD', KEYS[4], ARGV[9], fid)
  elseif kind == 'requeue' then
    redis.call('HSET', jk, 'status', 'queued', 'meta', ARGV[10])
    push_flow(P, ARGV[15] ~= '' and ARGV[15] or (redis.call('HGET', jk, 'kumiko_flow') or 't|'), fid, false)
  end
end
if ARGV[12] ~= '1' then return false end
local ring = P .. 'ring'
for _ = 1, 32 do
  local flow = redis.call('LINDEX', ring, 0)
  if not flow then
    -- Idle lane: pick up anything stock RQ pushed onto the plain list, then retry once more.
    if sweep(P, KEYS[6], 100) == 0 then return false end
    flow = redis.call('LINDEX', ring, 0)
  end
  local q = P .. 'q:' .. flow
  local cap = cap_of(flow)
  local running = cap and redis.call('HINCRBY', P .. 'run', counter_of(flow), 1) or 0
  if cap and running > cap then
    -- At its cap (e.g. the cap was lowered): park it, pop nothing.
    redis.call('HINCRBY', P .. 'run', counter_of(flow), -1)
    redis.call('LPOP', ring)
    redis.call('HSET', P .. 'st', flow, 'p')
  else
    local id = redis.call('LPOP', q)
    if not id then
      if cap then redis.call('HINCRBY', P .. 'run', counter_of(flow), -1) end
      redis.call('LPOP', ring)
      redis.call('HDEL', P .. 'st', flow)
    else
      if redis.call('LLEN', q) == 0 then
        redis.call('LPOP', ring)
        redis.call('HDEL', P .. 'st', flow)
      elseif cap and running >= cap then
        redis.call('LPOP', ring)
        redis.call('HSET', P .. 'st', flow, 'p')
      else
        redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
        arm(P)  -- chain-wake: more work is waiting for an idle worker
      end
      local jk = 'rq:job:' .. id
      local f = redis.call('HMGET', jk, 'data', 'meta')
      if f[1] then
        redis.call('ZADD', KEYS[1], ARGV[4], id .. ':' .. ARGV[13])
        redis.call('HSET', jk, 'status', 'started', 'started_at', ARGV[2], 'worker_name', ARGV[3],
                   'last_heartbeat', ARGV[2])
        return {id, f[1], f[2] or ''}
      end
      -- The hash vanished while queued (deleted or expired): free the slot, take the next.
      if cap then release(P, flow, nil) end
    end
  end
end
return false
"""
)

# Move due scheduled jobs (retries, delays, debounces) into their flows, and sweep the plain
# RQ list. KEYS: scheduled zset, plain RQ list. ARGV: now, limit, now_iso, lane prefix.
# Returns {promoted count, next due time or false}.
PROMOTE = (
    _COMMON
    + r"""
local P = ARGV[4]
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local jk = 'rq:job:' .. id
  local flow = redis.call('HGET', jk, 'kumiko_flow')
  if flow then
    redis.call('HSET', jk, 'status', 'queued', 'enqueued_at', ARGV[3])
    push_flow(P, flow, id, false)
  elseif redis.call('EXISTS', jk) == 1 then
    redis.call('RPUSH', KEYS[2], id)  -- not ours: leave it to RQ's layout
  end
end
sweep(P, KEYS[2], 1000)
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {#ids, nxt[2] or false}
"""
)

# Refresh the lease of a running job (only while it is still registered: XX).
# KEYS: started zset, worker hash. ARGV: member, deadline, worker ttl, now_iso.
HEARTBEAT = r"""
if ARGV[1] ~= '' then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[1])
end
redis.call('HSET', KEYS[2], 'last_heartbeat', ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return 1
"""

# Take abandoned runs out of the started registry atomically, so only one reaper handles each.
# KEYS: started zset. ARGV: now, limit.
TAKE_ABANDONED = r"""
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, m in ipairs(members) do redis.call('ZREM', KEYS[1], m) end
return members
"""


class LaneScripts:
    def __init__(self, client: redis.Redis) -> None:
        self.enqueue: Script = client.register_script(ENQUEUE)
        self.enqueue_many: Script = client.register_script(ENQUEUE_MANY)
        self.step: Script = client.register_script(STEP)
        self.promote: Script = client.register_script(PROMOTE)
        self.heartbeat: Script = client.register_script(HEARTBEAT)
        self.take_abandoned: Script = client.register_script(TAKE_ABANDONED)


@cache
def scripts_for(client: redis.Redis) -> LaneScripts:
    return LaneScripts(client)
