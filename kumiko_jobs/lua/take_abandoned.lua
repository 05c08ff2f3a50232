-- Take abandoned runs out of the started registry atomically, so only one reaper handles each
-- (scripts.TakeAbandonedArgs). KEYS: 1 started zset.
local now, limit = ARGV[1], tonumber(ARGV[2])
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)
for _, m in ipairs(members) do redis.call('ZREM', KEYS[1], m) end
return members
