-- How a flow holds its waiting ids. Plain flows are lists (FIFO: RPUSH, LPOP). Ordered flows
-- (flows.py, the runs of Django tasks) are sorted sets scored (100 - priority) * 2^44 + sequence:
-- ZPOPMIN serves the highest priority first and equal priorities in the order they were queued,
-- O(log n) both ways. The priority is the job hash's kumiko_pri field (-100..100, default 0);
-- the sequence is the lane's counter, so a run queued again (a retry) goes behind its equals.
local SEQUENCE_SPAN = 17592186044416  -- 2^44: scores stay exact doubles (< 2^53)

local function ordered_score(P, id, front)
  local priority = tonumber(redis.call('HGET', job_key(id), 'kumiko_pri') or '0') or 0
  priority = math.max(-100, math.min(100, math.floor(priority)))
  local sequence = 0  -- front: ahead of every run of its priority
  if not front then sequence = redis.call('INCR', sequence_key(P)) % SEQUENCE_SPAN end
  -- Formatted by hand: Lua's default number-to-string keeps 14 digits, not all 16.
  return string.format('%.0f', (100 - priority) * SEQUENCE_SPAN + sequence)
end

-- A flow key that holds another type (something else wrote it) is renamed aside, kept for
-- operators as <lane>broken:<flow> and listed in the lane's broken set: the flow goes on with
-- a fresh key. Left in place, it failed every later push halfway, after its limits were counted and its
-- hash written (and a requeue into it lost the run).
local function set_aside(P, flow)
  local key = flow_key(P, flow)
  -- Under the broken set's name, outside the flows' namespace (a tenant id may end in
  -- ":broken"); the first copy of a flow is kept, a later one dropped.
  if redis.call('EXISTS', key) == 1 and redis.call('RENAMENX', key, broken_key(P) .. ':' .. flow) == 0 then
    redis.call('DEL', key)
  end
  redis.call('SADD', broken_key(P), flow)
end

-- The reply of a read or removal on a flow's key; a key of another type is set aside and
-- reads as ``empty`` (a replace push's drop, an operator's cancel, a restore's check).
local function on_flow(P, flow, reply, empty)
  if type(reply) == 'table' and reply.err then
    if not string.find(reply.err, 'WRONGTYPE', 1, true) then error(reply) end  -- as redis.call would
    set_aside(P, flow)
    return empty
  end
  return reply
end

local function flow_write(P, flow, id, front)
  if is_ordered(flow) then
    return redis.pcall('ZADD', flow_key(P, flow), ordered_score(P, id, front), id)
  elseif front then
    return redis.pcall('LPUSH', flow_key(P, flow), id)
  end
  return redis.pcall('RPUSH', flow_key(P, flow), id)
end

-- Add an id to its flow; a key of another type is set aside first, and the flow starts anew.
local function flow_add(P, flow, id, front)
  if on_flow(P, flow, flow_write(P, flow, id, front), false) == false then
    flow_write(P, flow, id, front)
  end
end

-- The next id of a flow (removed): id, false; false, false when it is empty; false, true when
-- its key holds another type (the caller quarantines the flow).
local function flow_pop(P, flow)
  if is_ordered(flow) then
    local popped = redis.pcall('ZPOPMIN', flow_key(P, flow))
    if popped.err then return false, true end
    return popped[1] or false, false
  end
  local id = redis.pcall('LPOP', flow_key(P, flow))
  if type(id) == 'table' then return false, true end
  return id, false
end

local function flow_size(P, flow)
  if is_ordered(flow) then return redis.call('ZCARD', flow_key(P, flow)) end
  return redis.call('LLEN', flow_key(P, flow))
end

local function flow_ids(P, flow)
  if is_ordered(flow) then return on_flow(P, flow, redis.pcall('ZRANGE', flow_key(P, flow), 0, -1), {}) end
  return on_flow(P, flow, redis.pcall('LRANGE', flow_key(P, flow), 0, -1), {})
end

-- Take one waiting id out of its flow (an operator's cancel): true if it was there.
local function flow_remove(P, flow, id)
  if is_ordered(flow) then return on_flow(P, flow, redis.pcall('ZREM', flow_key(P, flow), id), 0) == 1 end
  return on_flow(P, flow, redis.pcall('LREM', flow_key(P, flow), 1, id), 0) == 1
end

local function flow_holds(P, flow, id)
  if is_ordered(flow) then return on_flow(P, flow, redis.pcall('ZSCORE', flow_key(P, flow), id), false) ~= false end
  return on_flow(P, flow, redis.pcall('LPOS', flow_key(P, flow), id), false) ~= false
end
