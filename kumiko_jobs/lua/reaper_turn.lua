-- The reaper's turn at one abandoned run, before it writes the run's record: renew the reaper's
-- lock if this reaper still holds it, and say whether the run's lease is still there and expired.
-- A reaper whose pass outlived its lock (a slow database) would otherwise write records beside
-- the reaper that took the lock over, and count an attempt twice.
-- The run's meta is read in the same step: the attempt whose lease expired, not a later one that
-- a reaper which took the lock over has queued meanwhile.
-- KEYS: 1 the lane's reaper lock, 2 started registry, 3 the run's job hash.
-- ARGV: 1 the reaper's name, 2 lock milliseconds, 3 lease member, 4 now.
-- Returns {-1} when the lock is not this reaper's, {1, meta or nil} when the run is its to
-- finish, else {0}.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local score = redis.call('ZSCORE', KEYS[2], ARGV[3])
if not score or tonumber(score) > tonumber(ARGV[4]) then return {0} end
return {1, redis.call('HGET', KEYS[3], 'meta')}
