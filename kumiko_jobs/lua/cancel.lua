-- Cancel waiting jobs: the operators' "delete" (scripts.CancelArgs, then job ids).
-- KEYS: 1 active-limits hash. Returns one code per id: 'c' canceled, 'n' no such job, 'o' not a
-- kumiko job of these lanes, else the job's status (not waiting: refused).
local api_queue, worker_queue, now_iso, ttl = unpack(ARGV, 1, 4)
local IDS = 5
local active = KEYS[1]
local origins = {[api_queue] = true, [worker_queue] = true}

local out = {}
for i = IDS, #ARGV do
  local id = ARGV[i]
  local f = redis.call('HMGET', job_key(id), 'status', 'origin', 'kumiko_flow', 'kumiko_lk')
  local status, origin, flow, limit_keys = f[1], f[2], f[3], f[4]
  if not status then
    out[#out + 1] = 'n'
  elseif not origin or not origins[origin] or not flow then
    out[#out + 1] = 'o'
  elseif status == 'queued' or status == 'scheduled' then
    local P = origin .. ':'
    if status == 'scheduled' then
      redis.call('ZREM', rq_key('scheduled', origin), id)
    elseif not flow_remove(P, flow, id) then
      redis.call('LREM', rq_key('queue', origin), 1, id)  -- pushed by stock RQ, not swept yet
    else
      count_queued(P, -1)
    end
    -- A parked flow left empty is forgotten; a ringed one is dropped by the next claim (O(1)).
    if redis.call('HGET', state_key(P), flow) == PARKED and flow_size(P, flow) == 0 then
      redis.call('HDEL', state_key(P), flow)
    end
    forget_limits(active, limit_keys)
    redis.call('HSET', job_key(id), 'status', 'canceled', 'ended_at', now_iso)
    redis.call('EXPIRE', job_key(id), ttl)
    out[#out + 1] = 'c'
  else
    out[#out + 1] = status
  end
end
return out
