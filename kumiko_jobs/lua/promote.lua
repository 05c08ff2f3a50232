-- Move due scheduled jobs (retries, delays, debounces) into their flows, and sweep the plain RQ
-- list (scripts.PromoteArgs). KEYS: 1 scheduled zset, 2 plain RQ list.
-- Returns {promoted count, next due time or false}.
local now, limit, now_iso, P = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local scheduled, plain = KEYS[1], KEYS[2]

local ids = redis.call('ZRANGEBYSCORE', scheduled, '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(ids) do
  redis.call('ZREM', scheduled, id)
  local flow = redis.call('HGET', job_key(id), 'kumiko_flow')
  if flow then
    redis.call('HSET', job_key(id), 'status', 'queued', 'enqueued_at', now_iso)
    push_flow(P, flow, id, false)
  elseif redis.call('EXISTS', job_key(id)) == 1 then
    redis.call('RPUSH', plain, id)  -- not ours: leave it to RQ's layout
  end
end
sweep(P, plain, 1000)
local nxt = redis.call('ZRANGE', scheduled, 0, 0, 'WITHSCORES')
return {#ids, nxt[2] or false}
