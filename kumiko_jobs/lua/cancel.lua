-- Cancel waiting jobs (scripts.CancelArgs, then the job ids). KEYS: 1 active-limits hash, then
-- per lane (in CancelArgs order) its scheduled zset and its plain RQ list.
-- Returns one code per id: 'c' canceled, 'n' no such job, 'o' not a job of these lanes, else the
-- job's status (not waiting: refused, so its limits are released once, by its worker).
local now_iso, ttl, lanes = ARGV[1], ARGV[2], tonumber(ARGV[3])
local FIRST_ID = 4 + 2 * lanes
local active = KEYS[1]
local lane_of = {}  -- queue name -> {P, scheduled, plain}
for i = 1, lanes do
  lane_of[ARGV[2 + 2 * i]] = {P = ARGV[3 + 2 * i], scheduled = KEYS[2 * i], plain = KEYS[2 * i + 1]}
end

local out = {}
for i = FIRST_ID, #ARGV do
  local id = ARGV[i]
  local f = redis.call('HMGET', job_key(id), 'status', 'origin', 'kumiko_flow', 'kumiko_lk')
  local status, lane, flow = f[1], f[2] and lane_of[f[2]], f[3]
  if not status then
    out[#out + 1] = 'n'
  elseif not lane or not flow then
    out[#out + 1] = 'o'
  elseif status == 'queued' or status == 'scheduled' then
    local P = lane.P
    if status == 'scheduled' then
      redis.call('ZREM', lane.scheduled, id)
    elseif redis.call('LREM', flow_key(P, flow), 1, id) == 0 then
      redis.call('LREM', lane.plain, 1, id)  -- pushed by stock RQ and not swept yet
    end
    -- A parked flow left empty is forgotten; an empty ringed one is dropped by the next claim.
    if redis.call('HGET', state_key(P), flow) == PARKED and redis.call('LLEN', flow_key(P, flow)) == 0 then
      redis.call('HDEL', state_key(P), flow)
    end
    forget_limits(active, f[4])
    redis.call('HSET', job_key(id), 'status', 'canceled', 'ended_at', now_iso)
    redis.call('EXPIRE', job_key(id), ttl)
    out[#out + 1] = 'c'
  else
    out[#out + 1] = status
  end
end
return out
