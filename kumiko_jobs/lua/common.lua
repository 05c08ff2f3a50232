-- Shared helpers of every lane script. Prepended after the key helpers (keys.py), the flow
-- grammar (flows.py) and the flow store (flow_store.lua). P is a lane's key prefix
-- ("<prefix>:<lane>:").

-- Make sure an idle worker blocked on the lane's wake list gets up.
local function arm(P)
  if redis.call('LLEN', wake_key(P)) == 0 then redis.call('RPUSH', wake_key(P), '1') end
end

local function running_count(P, flow)
  return tonumber(redis.call('HGET', running_key(P), counter_of(flow)) or '0')
end

-- The lane's count of ids held in its flows (queued depth, read in O(1) by metrics). Every id
-- added to a flow counts here; the ids workers claim are taken off in batches, once a second
-- per worker process (lane.count_claims), so the per-job claim pays no extra command; an idle
-- lane resets it (see claim), which heals any drift.
local function count_queued(P, n)
  if n ~= 0 then redis.call('INCRBY', queued_key(P), n) end
end

-- A parked capped flow back in the ring if its scope is below the cap again (the caller knows
-- it is parked).
local function unpark_parked(P, flow)
  local cap = cap_of(flow)
  if not cap or running_count(P, flow) >= cap then return end
  if flow_size(P, flow) > 0 then
    redis.call('RPUSH', ring_key(P), flow)
    redis.call('HSET', state_key(P), flow, IN_RING)
    arm(P)
  else
    redis.call('HDEL', state_key(P), flow)
  end
end

-- Put a parked capped flow back in the ring when its scope is below the cap again.
local function unpark(P, flow)
  if cap_of(flow) and redis.call('HGET', state_key(P), flow) == PARKED then unpark_parked(P, flow) end
end

-- Append (or, with front, prepend) an id to its flow and make the flow eligible if it was idle.
local function push_flow(P, flow, id, front)
  flow_add(P, flow, id, front)
  count_queued(P, 1)
  local state = redis.call('HGET', state_key(P), flow)
  if state == PARKED then
    -- Releases unpark the flows they name. After a deploy changed a cap, old workers release
    -- the old flow only, though the new one shares its counter: a push looks again.
    unpark_parked(P, flow)
    return
  end
  if state then return end
  local cap = cap_of(flow)
  if cap and running_count(P, flow) >= cap then
    redis.call('HSET', state_key(P), flow, PARKED)
  else
    -- New flows first: an idle flow that gets work is served next.
    redis.call('LPUSH', ring_key(P), flow)
    redis.call('HSET', state_key(P), flow, IN_RING)
    arm(P)
  end
end

-- Ids pushed onto the plain RQ list by stock RQ code (its scheduler, the dashboard's requeue):
-- route them to their flows.
local function sweep(P, plain, max)
  local n = 0
  for _ = 1, max do
    local id = redis.call('LPOP', plain)
    if not id then break end
    local jk = job_key(id)
    -- An id whose hash is gone (expired, deleted) has nothing to run; writing its status would
    -- leave a hash of that one field, without a TTL.
    if redis.call('EXISTS', jk) == 1 then
      redis.call('HSET', jk, 'status', 'queued')
      push_flow(P, redis.call('HGET', jk, 'kumiko_flow') or NO_TENANT_FLOW, id, false)
      n = n + 1
    end
  end
  return n
end

-- A capped flow's slot frees: count it and unpark the flow (and the job's current flow, if a
-- deploy changed the cap since this run was queued).
local function release(P, flow, current)
  if not cap_of(flow) then return end
  if redis.call('HINCRBY', running_key(P), counter_of(flow), -1) <= 0 then
    redis.call('HDEL', running_key(P), counter_of(flow))
  end
  unpark(P, flow)
  if current ~= '' and current ~= flow then unpark(P, current) end
end

-- Count a run in each of its skip limits, or refuse it: returns the 1-based index of the limit
-- that is full (nothing counted then), or nil. credit (optional): per limit key, runs that stop
-- counting in the same script call (the waiting runs a "replace" drops), whose room it may take.
local function admit(active, limit_keys, limits, credit)
  local caps = {}
  for v in each_line(limits) do caps[#caps + 1] = tonumber(v) end
  local i, taken = 0, {}
  for key in each_line(limit_keys) do
    i = i + 1
    if redis.call('HINCRBY', active, key, 1) > caps[i] + (credit and credit[key] or 0) then
      redis.call('HINCRBY', active, key, -1)
      for _, k in ipairs(taken) do redis.call('HINCRBY', active, k, -1) end
      return i
    end
    taken[#taken + 1] = key
  end
  return nil
end

-- A run stops counting in its skip limits (it finished, failed finally, or was dropped).
local function forget_limits(active, limit_keys)
  for key in each_line(limit_keys) do
    if redis.call('HINCRBY', active, key, -1) <= 0 then redis.call('HDEL', active, key) end
  end
end

-- The skip limits a waiting run counts, and whether its hash is there: its hash's, or for a run
-- whose hash was lost (deleted, evicted) ``same``, the keys of a run of the same flow (the same
-- job, tenant and scope). One read: every job hash has a status.
local function waiting_limits(old, same)
  local f = redis.call('HMGET', job_key(old), 'kumiko_lk', 'status')
  if not f[2] then return same, false end
  return f[1] or '', true
end

-- concurrency="replace": the waiting runs of a flow will never run; ``limit_keys``: the
-- replacing run's. Returns their ids.
local function drop_waiting(P, active, flow, limit_keys)
  local dropped = {}
  for _, old in ipairs(flow_ids(P, flow)) do
    local limits, held = waiting_limits(old, limit_keys)
    forget_limits(active, limits)
    if held then  -- no stub hash for a lost one
      redis.call('HSET', job_key(old), 'status', 'canceled')
      redis.call('EXPIRE', job_key(old), 86400)
    end
    dropped[#dropped + 1] = old
  end
  redis.call('DEL', flow_key(P, flow))
  count_queued(P, -#dropped)
  return dropped
end

-- A scripts.Ending starting at ARGV[first], as a table.
local function ending(args, first)
  local kind, ttl, retry_at, meta, exc_info, flow, limit_keys, current = unpack(args, first, first + 7)
  return {kind = kind, ttl = ttl, retry_at = retry_at, meta = meta, exc_info = exc_info, flow = flow,
          limit_keys = limit_keys, current = current}
end

-- Record how an attempt ended (e: an ending; kinds: see scripts.py). The caller has taken the run
-- out of the started registry. R: the registries {finished, failed, scheduled, active}.
local function finish(P, R, id, now, now_iso, e)
  local kind, ttl, retry_at, meta, exc_info, flow, limit_keys, current =
    e.kind, e.ttl, e.retry_at, e.meta, e.exc_info, e.flow, e.limit_keys, e.current
  local jk = job_key(id)
  -- A job whose meta the worker could not read (given back, or failed as malformed): the flow
  -- it was claimed from and its skip limits, from its hash, so its cap slot and limits are
  -- released all the same. (A readable job always names its flow.)
  if flow == '' then
    flow = redis.call('HGET', jk, 'kumiko_flow') or ''
    if limit_keys == '' then limit_keys = redis.call('HGET', jk, 'kumiko_lk') or '' end
  end
  if flow ~= '' then release(P, flow, current) end
  if kind == '' then
    -- Let go without an outcome (the reaper, for a run whose hash is gone or whose record is
    -- ahead of it): the hash it saw (its meta) is deleted, so the stale-run repair pushes the
    -- run again from its record, its skip limits still counted. A hash pushed again meanwhile
    -- (a new meta, or one where the reaper saw none) stays.
    if meta ~= '' and redis.call('HGET', jk, 'meta') == meta then redis.call('DEL', jk) end
    return
  end
  if kind == 'ok' or kind == 'failed' then forget_limits(R.active, limit_keys) end
  if kind == 'ok' and tonumber(ttl) == 0 then
    -- RESULT_TTL 0 (the default): the run record is the history; Redis forgets the job.
    redis.call('DEL', jk)
    return
  end
  if redis.call('EXISTS', jk) == 0 then return end  -- deleted behind our back: nothing to record
  if kind == 'ok' then
    redis.call('HSET', jk, 'status', 'finished', 'ended_at', now_iso)
    redis.call('EXPIRE', jk, ttl)
    redis.call('ZADD', R.finished, now + ttl, id)
  elseif kind == 'failed' then
    redis.call('HSET', jk, 'status', 'failed', 'ended_at', now_iso, 'exc_info', exc_info)
    if meta ~= '' then redis.call('HSET', jk, 'meta', meta) end
    redis.call('EXPIRE', jk, ttl)
    redis.call('ZADD', R.failed, now + ttl, id)
  elseif kind == 'retry' then
    redis.call('HSET', jk, 'status', 'scheduled', 'meta', meta)
    redis.call('ZADD', R.scheduled, retry_at, id)
  elseif kind == 'requeue' then
    redis.call('HSET', jk, 'status', 'queued', 'meta', meta)
    push_flow(P, flow ~= '' and flow or (redis.call('HGET', jk, 'kumiko_flow') or NO_TENANT_FLOW), id, false)
  elseif kind == 'return' then
    -- Claimed and never started (a stopping worker gives its ready jobs back): first in its flow again.
    redis.call('HSET', jk, 'status', 'queued')
    push_flow(P, flow ~= '' and flow or NO_TENANT_FLOW, id, true)
  end
end

-- Take the flow just served off the ring: rotated to the tail, LREM from the tail finds it at once.
local function unring(P, flow)
  redis.call('LREM', ring_key(P), -1, flow)
end

-- A flow whose key is not of its kind (a list; a sorted set for an ordered flow), written by
-- something else, is taken out of service and listed for operators, so one bad key cannot stop
-- the lane.
local function quarantine(P, flow, cap)
  if cap then redis.call('HINCRBY', running_key(P), counter_of(flow), -1) end
  unring(P, flow)
  redis.call('HDEL', state_key(P), flow)
  set_aside(P, flow)
end

-- Serve the ring: rotate its head flow to the tail and pop one id from it; a flow left empty, or a
-- capped flow at its cap, is taken off the tail again at once (an idle flow must not linger in
-- the ring: its next run goes to the head, "new flows first"). Registers the claimed run as
-- started under lease member id..':'..execution. Returns {id, data, meta} or false when idle.
local function claim(P, started, plain, deadline, now_iso, worker, execution)
  local ring = ring_key(P)
  for _ = 1, 32 do
    local flow = redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
    if not flow then
      -- Idle lane: pick up anything stock RQ pushed onto the plain list, then look once more.
      if sweep(P, plain, 100) == 0 then
        -- No flow holds work: the queued count is 0 (heals any drift, e.g. keys deleted by hand).
        if redis.call('HLEN', state_key(P)) == 0 then redis.call('DEL', queued_key(P)) end
        return false
      end
      flow = redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
      if not flow then return false end
    end
    local cap = cap_of(flow)
    local running = cap and redis.call('HINCRBY', running_key(P), counter_of(flow), 1) or 0
    local id = false
    if cap and running > cap then
      -- At its cap (e.g. the cap was lowered): park it, pop nothing.
      redis.call('HINCRBY', running_key(P), counter_of(flow), -1)
      unring(P, flow)
      redis.call('HSET', state_key(P), flow, PARKED)
    else
      local broken
      id, broken = flow_pop(P, flow)
      if broken then
        quarantine(P, flow, cap)
        id = false
      elseif not id then
        if cap then redis.call('HINCRBY', running_key(P), counter_of(flow), -1) end
        unring(P, flow)
        redis.call('HDEL', state_key(P), flow)
      elseif flow_size(P, flow) == 0 then
        unring(P, flow)
        redis.call('HDEL', state_key(P), flow)
      elseif cap and running >= cap then
        unring(P, flow)
        redis.call('HSET', state_key(P), flow, PARKED)
      else
        arm(P)  -- chain-wake: more work is waiting for an idle worker
      end
    end
    if id then
      local f = redis.pcall('HMGET', job_key(id), 'data', 'meta')
      if type(f) == 'table' and not f.err and f[1] then
        redis.call('ZADD', started, deadline, id .. ':' .. execution)
        redis.call('HSET', job_key(id), 'status', 'started', 'started_at', now_iso, 'worker_name', worker,
                   'last_heartbeat', now_iso)
        return {id, f[1], f[2] or ''}
      end
      -- The hash vanished while queued (deleted, expired, or overwritten with another type):
      -- free the slot, take the next.
      if cap then release(P, flow, '') end
    end
  end
  -- Each of 32 ring entries was dead (emptied, parked, broken, or its hash gone): flows may still
  -- wait behind them (a bulk cancel leaves many), so a worker looks again at once instead of
  -- after its block timeout.
  if redis.call('LLEN', ring) > 0 then arm(P) end
  return false
end

-- Add a worker's tally of ended attempts (outcome_counts.py) to the lane's hourly counters, read
-- by the admin console (lane_stats.py): per outcome and per job and outcome in a hash, succeeded
-- runs and final failures per tenant in a sorted set each. `n` entries of (hour, outcome, count,
-- job, tenant) start at ARGV[first]. A key gets its TTL when a field of it is created.
local function count_outcomes(P, argv, first, n)
  for i = first, first + 5 * (n - 1), 5 do
    local hour, outcome, count, job, tenant = argv[i], argv[i + 1], tonumber(argv[i + 2]), argv[i + 3], argv[i + 4]
    local sk = stats_key(P, hour)
    if redis.call('HINCRBY', sk, outcome, count) == count then redis.call('EXPIRE', sk, STATS_TTL) end
    redis.call('HINCRBY', sk, 'j|' .. job .. '|' .. outcome, count)
    local tk
    if outcome == 'succeeded' then tk = succeeding_key(P, hour) elseif outcome == 'failed' then tk = failing_key(P, hour) end
    if tk then
      if tenant == '' then tenant = NO_TENANT end
      if tonumber(redis.call('ZINCRBY', tk, count, tenant)) == count then redis.call('EXPIRE', tk, STATS_TTL) end
    end
  end
end
