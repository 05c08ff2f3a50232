-- Put finished, failed or canceled jobs back in their flows: the operators' "requeue"
-- (scripts.RequeueArgs, then per job: id, limits ("\n"-joined, one per key of its kumiko_lk;
-- 0 = no check)). KEYS: 1 active-limits hash.
-- Returns one code per job: 'q' requeued, 'n' no such job, 'o' not ours, 's<i>' the i-th limit
-- is full, else the job's status (queued or running: refused).
local api_queue, worker_queue, now_iso = unpack(ARGV, 1, 3)
local JOBS, PER_JOB = 4, 2
local active = KEYS[1]
local origins = {[api_queue] = true, [worker_queue] = true}
local finished = {finished = true, failed = true, canceled = true, stopped = true}

-- Take the limits again; 0 means the declaration no longer has that limit (no check).
local function retake(limit_keys, limits)
  local caps = {}
  for v in each_line(limits) do caps[#caps + 1] = tonumber(v) end
  local i, taken = 0, {}
  for key in each_line(limit_keys) do
    i = i + 1
    local cap = caps[i] or 0
    if redis.call('HINCRBY', active, key, 1) > cap and cap > 0 then
      redis.call('HINCRBY', active, key, -1)
      for _, k in ipairs(taken) do redis.call('HINCRBY', active, k, -1) end
      return 's' .. i
    end
    taken[#taken + 1] = key
  end
  return nil
end

local out = {}
for base = JOBS, #ARGV, PER_JOB do
  local id, limits = ARGV[base], ARGV[base + 1]
  local f = redis.call('HMGET', job_key(id), 'status', 'origin', 'kumiko_flow', 'kumiko_lk')
  local status, origin, flow, limit_keys = f[1], f[2], f[3], f[4]
  local code = nil
  if not status then
    code = 'n'
  elseif not origin or not origins[origin] or not flow then
    code = 'o'
  elseif status == 'scheduled' then
    redis.call('ZREM', rq_key('scheduled', origin), id)  -- still holds its limits: moved up
  elseif finished[status] then
    code = retake(limit_keys, limits)
    if not code then
      for _, registry in ipairs({'failed', 'finished', 'canceled'}) do
        redis.call('ZREM', rq_key(registry, origin), id)
      end
      redis.call('PERSIST', job_key(id))
    end
  else
    code = status
  end
  if not code then
    redis.call('HSET', job_key(id), 'status', 'queued', 'enqueued_at', now_iso)
    push_flow(origin .. ':', flow, id, false)
    code = 'q'
  end
  out[#out + 1] = code
end
return out
