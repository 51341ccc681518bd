#!lua
--!df flags=allow-undeclared-keys
-- Change a queue's flow-control limits (see include/flow.lua for the fields). Every parked
-- tenant goes back to its ring and an idle worker is woken, so a raised limit is used at
-- the next claim; a lowered one holds from the next claim on.
--
-- K.limits
-- K.buckets
-- K.parked
-- K.ready_prefix
-- K.ring_prefix
-- K.priorities
-- K.wake
-- K.counts
-- A.clear         '1': remove every limit (and bucket) first, '' to change only the fields
-- A.changes       number of changes that follow, 2 fields each: field, value ('' removes
--                 the field). Fields: concurrency, tenant_concurrency, c:<tenant> (an
--                 integer >= 0); rate, tenant_rate, r:<tenant> (jobs per second, > 0)
-- Returns: the limits hash after the change, flat (field, value, ...)
--@include ready
--@include flow

local clear, n = A.clear, tonumber(A.changes)
local FIRST, FIELDS, FIELD, VALUE = ITEM.first, ITEM.fields, ITEM.field, ITEM.value
if not n or #ARGV ~= FIRST - 1 + n * FIELDS then
  return redis.error_reply('ERR set_limits: expected ' .. tostring(n) .. ' changes of '
    .. FIELDS .. ' fields')
end

local CAPS = { concurrency = true, tenant_concurrency = true }
local RATES = { rate = true, tenant_rate = true }
for i = 0, n - 1 do
  local field, value = ARGV[FIRST + i * FIELDS + FIELD], ARGV[FIRST + i * FIELDS + VALUE]
  local is_cap = CAPS[field] or (string.sub(field, 1, 2) == 'c:' and #field > 2)
  local is_rate = RATES[field] or (string.sub(field, 1, 2) == 'r:' and #field > 2)
  if not is_cap and not is_rate then
    return redis.error_reply('ERR set_limits: unknown limit ' .. field)
  end
  local v = tonumber(value)
  if value ~= '' and is_cap and (not v or v < 0 or v ~= math.floor(v)) then
    return redis.error_reply('ERR set_limits: ' .. field .. ' must be an integer >= 0')
  end
  if value ~= '' and is_rate and (not v or v <= 0 or v ~= v or v == math.huge) then
    return redis.error_reply('ERR set_limits: ' .. field .. ' must be a number > 0')
  end
end

if clear == '1' then redis.call('DEL', K.limits, K.buckets) end
for i = 0, n - 1 do
  local field, value = ARGV[FIRST + i * FIELDS + FIELD], ARGV[FIRST + i * FIELDS + VALUE]
  if value == '' then
    redis.call('HDEL', K.limits, field)
    if string.sub(field, 1, 2) == 'r:' then
      redis.call('HDEL', K.buckets, 't:' .. string.sub(field, 3))
    end
  else
    redis.call('HSET', K.limits, field, value)
  end
end
if redis.call('EXISTS', K.limits) == 0 then redis.call('DEL', K.buckets) end
flow_unpark_all(K)
if (tonumber(redis.call('HGET', K.counts, 'ready')) or 0) > 0 then wake_one(K.wake) end
return redis.call('HGETALL', K.limits)
