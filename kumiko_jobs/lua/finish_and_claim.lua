-- The lane step: finish attempts and claim jobs, in one round trip. One job thread sends at most
-- one of each; the claimer of a --threads process sends those of all its job threads (claiming.py).
-- ARGV: scripts.FinishAndClaimArgs, then `finished` entries of (id, member, scripts.Ending),
-- then `claims` execution ids, then `counts` entries of ended-attempt counts (5 items each:
-- outcome_counts.py).
-- KEYS: 1 started, 2 finished, 3 failed, 4 scheduled, 5 active-limits hash, 6 plain RQ list.
-- Returns {id, data, meta} per claimed job, flat; fewer than `claims` when the lane ran dry.
local now, now_iso, worker, deadline, P, finished, claims, counts = unpack(ARGV, 1, 8)
local HEADER, FINISHED_ITEMS = 8, 10
local R = {finished = KEYS[2], failed = KEYS[3], scheduled = KEYS[4], active = KEYS[5]}
finished, claims, counts = tonumber(finished), tonumber(claims), tonumber(counts)
now = tonumber(now)

-- Only the holder of the run's lease tells Redis how it ended: if the reaper took the lease (the
-- worker stalled past ABANDON_AFTER), the run is already back in its flow or failed.
for i = HEADER + 1, HEADER + FINISHED_ITEMS * (finished - 1) + 1, FINISHED_ITEMS do
  local id, member = ARGV[i], ARGV[i + 1]
  if redis.call('ZREM', KEYS[1], member) == 1 then
    finish(P, R, id, now, now_iso, ending(ARGV, i + 2))
  end
end
local first_claim = HEADER + FINISHED_ITEMS * finished + 1
count_outcomes(P, ARGV, first_claim + claims, counts)
local jobs = {}
for i = first_claim, first_claim + claims - 1 do
  local job = claim(P, KEYS[1], KEYS[6], deadline, now_iso, worker, ARGV[i])
  if not job then break end  -- the lane ran dry: the other claims would find nothing either
  jobs[#jobs + 1] = job[1]
  jobs[#jobs + 1] = job[2]
  jobs[#jobs + 1] = job[3]
end
return jobs
