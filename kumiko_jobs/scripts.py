"""Lua scripts: every multi-key state change on a lane is one atomic script call.

Loaded once per client (redis-py re-loads on NOSCRIPT). Job hashes keep RQ's field layout,
so RQ and django-rq can read what these scripts write.
"""

from __future__ import annotations

from functools import cache

import redis
from redis.commands.core import Script

# Write a job hash and queue it (or schedule it). KEYS: job hash, queue list, scheduled zset.
# ARGV: unique ('1' = refuse an existing id), run_at (0 = now), then field/value pairs.
ENQUEUE = r"""
if ARGV[1] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local fields = {}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(fields))
local id = string.sub(KEYS[1], 8)
if tonumber(ARGV[2]) > 0 then
  redis.call('ZADD', KEYS[3], ARGV[2], id)
else
  redis.call('RPUSH', KEYS[2], id)
end
return 1
"""

# Finish the previous job (optional) and claim the next one (optional) in one round trip.
# KEYS: queue, started (wip), finished, failed, scheduled, claiming list of this worker.
# ARGV: 1 now, 2 now_iso, 3 worker, 4 heartbeat deadline, 5 finish id, 6 finish kind
#       (ok|failed|retry|requeue), 7 wip member of the finished run, 8 ttl, 9 retry_at,
#       10 new meta ('' keeps), 11 exc_info, 12 claim source (queue|claiming|''), 13 execution id
STEP = r"""
local now = tonumber(ARGV[1])
local fid = ARGV[5]
if fid ~= '' then
  local jk = 'rq:job:' .. fid
  redis.call('ZREM', KEYS[2], ARGV[7])
  local kind = ARGV[6]
  if redis.call('EXISTS', jk) == 0 then
    kind = 'gone'
  end
  if kind == 'ok' then
    redis.call('HSET', jk, 'status', 'finished', 'ended_at', ARGV[2])
    redis.call('EXPIRE', jk, ARGV[8])
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[8]), fid)
  elseif kind == 'failed' then
    redis.call('HSET', jk, 'status', 'failed', 'ended_at', ARGV[2], 'exc_info', ARGV[11])
    if ARGV[10] ~= '' then redis.call('HSET', jk, 'meta', ARGV[10]) end
    redis.call('EXPIRE', jk, ARGV[8])
    redis.call('ZADD', KEYS[4], now + tonumber(ARGV[8]), fid)
  elseif kind == 'retry' then
    redis.call('HSET', jk, 'status', 'scheduled', 'meta', ARGV[10])
    redis.call('ZADD', KEYS[5], ARGV[9], fid)
  elseif kind == 'requeue' then
    redis.call('HSET', jk, 'status', 'queued', 'meta', ARGV[10])
    redis.call('RPUSH', KEYS[1], fid)
  end
end
local source = ARGV[12]
if source == '' then
  return false
end
local src = KEYS[1]
if source == 'claiming' then src = KEYS[6] end
for _ = 1, 16 do
  local id = redis.call('LPOP', src)
  if not id then
    return false
  end
  local jk = 'rq:job:' .. id
  local f = redis.call('HMGET', jk, 'data', 'meta')
  if f[1] then
    redis.call('ZADD', KEYS[2], ARGV[4], id .. ':' .. ARGV[13])
    redis.call('HSET', jk, 'status', 'started', 'started_at', ARGV[2], 'worker_name', ARGV[3],
               'last_heartbeat', ARGV[2])
    return {id, f[1], f[2] or ''}
  end
  -- The hash expired or was deleted while queued (RQ skips such ids too): take the next id.
end
return false
"""

# Move due scheduled jobs (retries, delays) onto the queue; return how many and the next due time.
# KEYS: scheduled zset, queue list. ARGV: now, limit, now_iso.
PROMOTE = r"""
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local jk = 'rq:job:' .. id
  if redis.call('EXISTS', jk) == 1 then
    redis.call('HSET', jk, 'status', 'queued', 'enqueued_at', ARGV[3])
    redis.call('RPUSH', KEYS[2], id)
  end
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {#ids, nxt[2] or false}
"""

# Refresh the lease of a running job (only if it is still registered: XX).
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


# Return ids a dead worker had moved into its claiming list to the head of the queue.
# KEYS: claimers set, queue. ARGV: claiming key prefix, own worker name.
RECLAIM = r"""
local moved = 0
for _, name in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if name ~= ARGV[2] then
    local wk = 'rq:worker:' .. name
    if redis.call('EXISTS', wk) == 0 or redis.call('HEXISTS', wk, 'death') == 1 then
      local list = ARGV[1] .. name
      while redis.call('LMOVE', list, KEYS[2], 'RIGHT', 'LEFT') do moved = moved + 1 end
      redis.call('SREM', KEYS[1], name)
    end
  end
end
return moved
"""


class LaneScripts:
    def __init__(self, client: redis.Redis) -> None:
        self.enqueue: Script = client.register_script(ENQUEUE)
        self.step: Script = client.register_script(STEP)
        self.promote: Script = client.register_script(PROMOTE)
        self.heartbeat: Script = client.register_script(HEARTBEAT)
        self.take_abandoned: Script = client.register_script(TAKE_ABANDONED)
        self.reclaim: Script = client.register_script(RECLAIM)


@cache
def scripts_for(client: redis.Redis) -> LaneScripts:
    return LaneScripts(client)
