-- The lane step: finish attempts and claim jobs, in one round trip. One job thread sends at most
-- one of each; the claimer of a --threads process sends those of all its job threads (claiming.py).
-- ARGV: scripts.FinishAndClaimArgs (9 fields), then `finished` entries of (id, member, scripts.Ending),
-- then `claims` execution ids, then `counts` entries of ended-attempt counts (5 items each:
-- outcome_counts.py).
-- KEYS: 1 started, 2 finished, 3 failed, 4 scheduled, 5 active-limits hash, 6 plain RQ list.
-- Returns {id, data, meta} per claimed job, flat; fewer than `claims` when the lane ran dry. A
-- call sent again (`again`) that finds its claims returns {'again', id, data, meta, execution, ...}.
local now, now_iso, worker, deadline, P, finished, claims, counts, again = unpack(ARGV, 1, 9)
local HEADER, FINISHED_ITEMS = 9, 10
local R = {finished = KEYS[2], failed = KEYS[3], scheduled = KEYS[4], active = KEYS[5]}
finished, claims, counts = tonumber(finished), tonumber(claims), tonumber(counts)
now = tonumber(now)
local first_claim = HEADER + FINISHED_ITEMS * finished + 1

-- The same call again, its first outcome lost: if the first one ran, its claims are in the
-- started registry under these execution ids. Return them, and do nothing else (its finishes
-- and counts are in): claiming again would leave them with no worker until the reaper counted
-- an attempt each. One scan of the registry, on this rare path only. Each job comes with its
-- execution id (a claim may be missing: reaped, its hash deleted), and its lease runs from now.
if again == '1' and claims > 0 then
  local wanted, found = {}, {}
  for i = first_claim, first_claim + claims - 1 do wanted[ARGV[i]] = i - first_claim + 1 end
  local cursor = '0'
  repeat
    local page = redis.call('ZSCAN', KEYS[1], cursor, 'COUNT', 1000)
    cursor = page[1]
    for j = 1, #page[2], 2 do
      local member = page[2][j]
      local id, execution = string.match(member, '^(.*):([^:]*)$')
      if execution and wanted[execution] then found[wanted[execution]] = id end
    end
  until cursor == '0'
  local jobs = {'again'}
  for k = 1, claims do
    local id = found[k]
    if id then
      local f = redis.call('HMGET', job_key(id), 'data', 'meta')
      if f[1] then
        local execution = ARGV[first_claim + k - 1]
        redis.call('ZADD', KEYS[1], 'XX', deadline, id .. ':' .. execution)
        jobs[#jobs + 1] = id
        jobs[#jobs + 1] = f[1]
        jobs[#jobs + 1] = f[2] or ''
        jobs[#jobs + 1] = execution
      end
    end
  end
  if #jobs > 1 then return jobs end
end

-- Only the holder of the run's lease tells Redis how it ended: if the reaper took the lease (the
-- worker stalled past ABANDON_AFTER), the run is already back in its flow or failed.
for i = HEADER + 1, HEADER + FINISHED_ITEMS * (finished - 1) + 1, FINISHED_ITEMS do
  local id, member = ARGV[i], ARGV[i + 1]
  if redis.call('ZREM', KEYS[1], member) == 1 then
    finish(P, R, id, now, now_iso, ending(ARGV, i + 2))
  end
end
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
