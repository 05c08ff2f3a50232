-- Admit and queue (or schedule) one job atomically with its gates (scripts.EnqueueArgs).
-- KEYS: 1 job hash, 2 scheduled zset, 3 active-limits hash. ARGV: EnqueueArgs, then the
-- field/value pairs of the job hash. Returns {'q', dropped ids...} | {'d'} | {'s', limit index}
-- | {'b', pending job id} | {'r', the newer waiting job id}.
local unique, run_at, P, flow, limit_keys, limits, replace, debounce_key, debounce_seconds, now,
      restore, late = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8],
      tonumber(ARGV[9]), tonumber(ARGV[10]), ARGV[11], ARGV[12]
local FIELDS = 13
local job, scheduled, active = KEYS[1], KEYS[2], KEYS[3]
local id = string.sub(job, #job_key('') + 1)

if unique == '1' and redis.call('EXISTS', job) == 1 then return {'d'} end
if debounce_key ~= '' then
  local pending = redis.call('GET', debounce_key)
  if pending and redis.call('HGET', job_key(pending), 'status') == 'scheduled' then
    -- Trailing-edge debounce: the pending run takes the newest payload and waits again.
    for i = FIELDS, #ARGV, 2 do
      if ARGV[i] == 'data' or ARGV[i] == 'description' then
        redis.call('HSET', job_key(pending), ARGV[i], ARGV[i + 1])
      end
    end
    redis.call('ZADD', scheduled, now + debounce_seconds, pending)
    -- The key lives as long as the pending run waits: a burst longer than its first TTL must
    -- not start a second pending run.
    redis.call('PEXPIRE', debounce_key, math.floor(debounce_seconds * 2000) + 1000)
    return {'b', pending}
  end
end
if late == '1' and replace == '1' then
  -- Pushed from its record after the fact (the outbox after a Redis outage): a run of its flow
  -- dispatched after it and waiting already is the newer payload, and replace keeps the newest.
  -- created_at is the dispatch time, in RQ's fixed-width UTC format: compared as text.
  local own
  for i = FIELDS, #ARGV, 2 do
    if ARGV[i] == 'created_at' then own = ARGV[i + 1] end
  end
  if own then
    for _, old in ipairs(flow_ids(P, flow)) do
      local theirs = redis.call('HGET', job_key(old), 'created_at')
      if theirs and theirs > own then
        if restore == '1' then
          -- A lost hash pushed again: its skip limits are still counted from its first push,
          -- and it will never end to give them back.
          for i = FIELDS, #ARGV, 2 do
            if ARGV[i] == 'kumiko_lk' then forget_limits(active, ARGV[i + 1]) end
          end
        end
        return {'r', old}
      end
    end
  end
end
local credit
if replace == '1' and limit_keys ~= '' then
  -- The waiting runs this one replaces stop counting in their limits below: a limit they fill
  -- is room for it. (Refusing instead kept the stale run and turned "replace" into "skip".)
  credit = {}
  for _, old in ipairs(flow_ids(P, flow)) do
    for key in each_line((waiting_limits(old, limit_keys))) do  -- the keys only
      credit[key] = (credit[key] or 0) + 1
    end
  end
end
local refused = admit(active, limit_keys, limits, credit)
if refused then return {'s', refused} end

redis.call('HSET', job, unpack(ARGV, FIELDS))
if restore == '1' and (redis.call('ZSCORE', scheduled, id) or flow_holds(P, flow, id)) then
  -- Only the hash was lost: the id still waits in its flow or the scheduled set.
  return {'q'}
end
local out = {'q'}
if replace == '1' then
  for _, old in ipairs(drop_waiting(P, active, flow, limit_keys)) do out[#out + 1] = old end
end
if debounce_key ~= '' then
  redis.call('SET', debounce_key, id, 'PX', math.floor(debounce_seconds * 2000) + 1000)
end
if run_at > 0 then
  redis.call('ZADD', scheduled, run_at, id)
else
  push_flow(P, flow, id, false)
end
return out
