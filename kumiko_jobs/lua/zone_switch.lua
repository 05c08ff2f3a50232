-- Install a tenant zone index generation, unless a later one is installed already (two rebuilds
-- at once: refresh_tenant_zones() beside the leader's). Generation numbers are taken before the
-- tenants are read, so a later number began its read later.
-- KEYS: 1 the generation hash. ARGV: 1 generation, 2 now.
-- Returns the generation it replaced (0: none), or -1 when it was not installed.
local current = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0')
if tonumber(ARGV[1]) <= current then return -1 end
redis.call('HSET', KEYS[1], 'gen', ARGV[1], 'at', ARGV[2])
return current
