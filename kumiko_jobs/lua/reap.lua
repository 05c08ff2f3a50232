-- Finish an abandoned run: only if its lease is still in the started registry and expired, and
-- in the same step that takes it out (scripts.ReapArgs, then a scripts.Ending). A reaper that dies before this call
-- leaves the run where the next reaper finds it again.
-- KEYS: 1 started, 2 finished, 3 failed, 4 scheduled, 5 active-limits hash. Returns 1 if finished.
local now, now_iso, member, id, P = unpack(ARGV, 1, 5)
local R = {finished = KEYS[2], failed = KEYS[3], scheduled = KEYS[4], active = KEYS[5]}

local score = redis.call('ZSCORE', KEYS[1], member)
if not score or tonumber(score) > tonumber(now) then return 0 end  -- renewed or already handled
redis.call('ZREM', KEYS[1], member)
finish(P, R, id, tonumber(now), now_iso, ending(ARGV, 6))
return 1
