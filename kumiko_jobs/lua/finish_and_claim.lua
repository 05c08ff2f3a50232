-- The lane step: finish the previous attempt (optional) and claim the next job (optional), in
-- one round trip (scripts.FinishAndClaimArgs).
-- KEYS: 1 started, 2 finished, 3 failed, 4 scheduled, 5 active-limits hash, 6 plain RQ list.
-- Returns {id, data, meta} of the claimed job, or false.
local now, now_iso, worker, deadline, id, kind, member, ttl, retry_at, meta, exc_info, do_claim,
      execution, P, flow, limit_keys, current, stat, stat_job, stat_tenant = unpack(ARGV, 1, 20)
local R = {finished = KEYS[2], failed = KEYS[3], scheduled = KEYS[4], active = KEYS[5]}

if id ~= '' then
  redis.call('ZREM', KEYS[1], member)
  finish(P, R, id, kind, tonumber(now), now_iso, ttl, retry_at, meta, exc_info, flow, limit_keys, current)
  count_outcome(P, tonumber(now), stat, stat_job, stat_tenant)
end
if do_claim ~= '1' then return false end
return claim(P, KEYS[1], KEYS[6], deadline, now_iso, worker, execution)
