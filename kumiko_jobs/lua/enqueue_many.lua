-- Queue many new jobs that share most fields (a fan-out's children) in one call. No replace or
-- debounce gates; skip limits apply per job (scripts.EnqueueManyArgs).
-- KEYS: 1 active-limits hash. ARGV: lane prefix, count of shared field/value items, the shared
-- items, then per job: id, meta, description, flow, limit keys, limits.
-- Returns one code per job: 'q' queued, 'd' duplicate id, 's<i>' refused by its i-th limit.
local P, shared_n = ARGV[1], tonumber(ARGV[2])
local PER_JOB = 6
local active = KEYS[1]
local shared = {unpack(ARGV, 3, 2 + shared_n)}

local out = {}
for base = 3 + shared_n, #ARGV, PER_JOB do
  local id, meta, description, flow, limit_keys, limits = unpack(ARGV, base, base + PER_JOB - 1)
  local code = 'q'
  if redis.call('EXISTS', job_key(id)) == 1 then
    code = 'd'
  else
    local refused = admit(active, limit_keys, limits)
    if refused then code = 's' .. refused end
  end
  if code == 'q' then
    redis.call('HSET', job_key(id), 'meta', meta, 'description', description, 'kumiko_flow', flow,
               'kumiko_lk', limit_keys, unpack(shared))
    push_flow(P, flow, id, false)
  end
  out[#out + 1] = code
end
return out
