-- Refresh the leases of a worker's running jobs (only while still registered: XX) and the
-- worker's key (scripts.HeartbeatArgs, then the lease members). KEYS: 1 started, 2 worker hash.
local deadline, worker_ttl, now_iso = unpack(ARGV, 1, 3)
local MEMBERS = 4
for i = MEMBERS, #ARGV do redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[i]) end
redis.call('HSET', KEYS[2], 'last_heartbeat', now_iso)
redis.call('EXPIRE', KEYS[2], worker_ttl)
return 1
