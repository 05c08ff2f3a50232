-- Refresh the lease of a running job (only while it is still registered: XX) and the worker's
-- key (scripts.HeartbeatArgs). KEYS: 1 started zset, 2 worker hash.
local member, deadline, worker_ttl, now_iso = unpack(ARGV, 1, 4)
if member ~= '' then redis.call('ZADD', KEYS[1], 'XX', deadline, member) end
redis.call('HSET', KEYS[2], 'last_heartbeat', now_iso)
redis.call('EXPIRE', KEYS[2], worker_ttl)
return 1
