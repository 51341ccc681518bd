#!lua
-- Change a queue's flow-control limits (see include/flow.lua for the fields). Every parked
-- tenant goes back to its ring and an idle worker is woken, so a raised limit is used at
-- the next claim; a lowered one holds from the next claim on.
--
-- KEYS[1] limits
-- KEYS[2] buckets
-- KEYS[3] parked
-- KEYS[4] ready_prefix
-- KEYS[5] ring_prefix
-- KEYS[6] priorities
-- KEYS[7] wake
-- KEYS[8] counts
-- ARGV[1] clear   '1': remove every limit (and bucket) first, '' to change only the fields
-- ARGV[2] changes number of changes that follow, 2 fields each: field, value ('' removes
--                 the field). Fields: concurrency, tenant_concurrency, c:<tenant> (an
--                 integer >= 0); rate, tenant_rate, r:<tenant> (jobs per second, > 0)
-- Returns: the limits hash after the change, flat (field, value, ...)
--@include ready
--@include flow

local k = { limits = KEYS[1], buckets = KEYS[2], parked = KEYS[3], ready_prefix = KEYS[4],
  ring_prefix = KEYS[5], priorities = KEYS[6], wake = KEYS[7], counts = KEYS[8] }
local clear, n = ARGV[1], tonumber(ARGV[2])
if not n or #ARGV ~= 2 + n * 2 then
  return redis.error_reply('ERR set_limits: expected ' .. tostring(n) .. ' changes of 2 fields')
end

local CAPS = { concurrency = true, tenant_concurrency = true }
local RATES = { rate = true, tenant_rate = true }
for i = 0, n - 1 do
  local field, value = ARGV[3 + i * 2], ARGV[4 + i * 2]
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

if clear == '1' then redis.call('DEL', k.limits, k.buckets) end
for i = 0, n - 1 do
  local field, value = ARGV[3 + i * 2], ARGV[4 + i * 2]
  if value == '' then
    redis.call('HDEL', k.limits, field)
    if string.sub(field, 1, 2) == 'r:' then
      redis.call('HDEL', k.buckets, 't:' .. string.sub(field, 3))
    end
  else
    redis.call('HSET', k.limits, field, value)
  end
end
if redis.call('EXISTS', k.limits) == 0 then redis.call('DEL', k.buckets) end
flow_unpark_all(k)
if (tonumber(redis.call('HGET', k.counts, 'ready')) or 0) > 0 then wake_one(k.wake) end
return redis.call('HGETALL', k.limits)
