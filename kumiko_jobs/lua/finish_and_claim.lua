-- The lane step: finish the previous attempt (optional) and claim the next job (optional), in
-- one round trip (scripts.FinishAndClaimArgs, then a scripts.Ending, then `counts` entries of
-- ended-attempt counts, 5 items each: outcome_counts.py).
-- KEYS: 1 started, 2 finished, 3 failed, 4 scheduled, 5 active-limits hash, 6 plain RQ list.
-- Returns {id, data, meta} of the claimed job, or false.
local now, now_iso, worker, deadline, id, member, do_claim, execution, P, counts = unpack(ARGV, 1, 10)
local ENDING, ENDING_ITEMS = 11, 8
local R = {finished = KEYS[2], failed = KEYS[3], scheduled = KEYS[4], active = KEYS[5]}

-- Only the holder of the run's lease tells Redis how it ended: if the reaper took the lease (the
-- worker stalled past ABANDON_AFTER), the run is already back in its flow or failed.
if id ~= '' and redis.call('ZREM', KEYS[1], member) == 1 then
  finish(P, R, id, tonumber(now), now_iso, ending(ARGV, ENDING))
end
count_outcomes(P, ARGV, ENDING + ENDING_ITEMS, tonumber(counts))
if do_claim ~= '1' then return false end
return claim(P, KEYS[1], KEYS[6], deadline, now_iso, worker, execution)
