-- Refresh the leases of a worker's running jobs (only while still registered: XX) and the
-- worker's key (scripts.HeartbeatArgs, then the lease members). KEYS: 1 started, 2 worker hash.
-- Returns 1, or 0 if the worker hash is gone.
local deadline, worker_ttl, now_iso = unpack(ARGV, 1, 3)
local MEMBERS = 4
for i = MEMBERS, #ARGV do redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[i]) end
-- Gone while the worker runs (Redis lost its data, or the key expired during a long stall):
-- 0, and the worker registers again, whole (Heartbeat's on_lost), rather than a stub hash here.
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('HSET', KEYS[2], 'last_heartbeat', now_iso)
redis.call('EXPIRE', KEYS[2], worker_ttl)
return 1
