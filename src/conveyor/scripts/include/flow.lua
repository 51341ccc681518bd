-- Flow control: concurrency caps and token-bucket rates, for the queue and per tenant,
-- decided inside the claim.
--
-- The limits hash holds 'concurrency', 'rate', 'tenant_concurrency', 'tenant_rate' (the
-- queue's limits and every tenant's defaults) and 'c:<tenant>' / 'r:<tenant>' (one
-- tenant's overrides); rates are jobs per second. Running counts are kept whether or not
-- limits are set, so that a limit set later starts from the truth: counts.running for the
-- queue, running[tenant] per tenant (jobs without a tenant are subject to the queue's
-- limits only). A rate is a bucket of one second's worth of tokens (at least one), stored
-- as '<tokens> <ms>' in the buckets hash; an absent bucket is full.
--
-- A tenant at its cap or out of tokens leaves its ring and is parked ('<priority>:<tenant>'
-- in the parked zset, scored with when to look at it again): it costs the claim O(1) once,
-- never holds back the tenants behind it, and comes back when one of its runs ends or its
-- bucket has a token again (parked entries that come due are put back by every fetch).
-- While parked its ready list is non-empty, so nothing else puts it in the ring.
--@include ready
--@include counter

local FLOW_RECHECK_MS = 30000  -- a tenant parked at its cap is looked at again after this

-- Tokens in a bucket at `now` (ms), refilled at `rate` per second up to one second's worth.
local function bucket_tokens(state, rate, now)
  local size = math.max(rate, 1)
  if not state then return size end
  local tokens, ts = string.match(state, '^(%S+) (%S+)$')
  tokens, ts = tonumber(tokens), tonumber(ts)
  if not tokens or not ts then return size end
  return math.min(size, tokens + math.max(0, now - ts) * rate / 1000)
end

-- Whole tokens in a bucket; a sum of decimal refills that lands a hair under a whole number
-- (0.7 + 0.3 in binary floating point) counts as that number.
local function whole_tokens(tokens)
  return math.floor(tokens + 1e-9)
end

-- When (ms) a bucket holding `tokens` has a whole token again.
local function bucket_refill_at(tokens, rate, now)
  return now + math.max(1, math.ceil((1 - tokens) * 1000 / rate))
end

local function bucket_store(buckets, field, tokens, now)
  redis.call('HSET', buckets, field, string.format('%.6f %.3f', tokens, now))
end

-- A stored count or cap as a whole number, or nil when it is none (mangled data included).
local function whole(value)
  local n = tonumber(value)
  if not n or n ~= n or n == math.huge or n == -math.huge then return nil end
  return math.floor(n)
end

-- The queue-wide limits as numbers (nil: not set), or nil when the queue has none.
local function read_limits(limits)
  local f = redis.call('HMGET', limits, 'concurrency', 'rate', 'tenant_concurrency',
    'tenant_rate')
  local lim = { concurrency = whole(f[1]), rate = tonumber(f[2]),
    tenant_concurrency = whole(f[3]), tenant_rate = tonumber(f[4]) }
  if lim.rate and not (lim.rate > 0 and lim.rate < math.huge) then lim.rate = nil end
  if lim.tenant_rate and not (lim.tenant_rate > 0 and lim.tenant_rate < math.huge) then
    lim.tenant_rate = nil
  end
  if lim.concurrency or lim.rate or lim.tenant_concurrency or lim.tenant_rate then return lim end
  if redis.call('HLEN', limits) > 0 then return lim end  -- only per-tenant overrides
  return nil
end

-- Put a tenant back in its ring (it was parked): only while it has ready jobs.
local function flow_return(k, priority, tenant)
  if list_call('LLEN', k.ready_prefix .. priority .. ':' .. tenant) > 0 then
    redis.call('RPUSH', k.ring_prefix .. priority, tenant)
    redis.call('ZADD', k.priorities, priority, priority)
  end
end

local function flow_park(k, priority, tenant, until_ms)
  redis.call('ZADD', k.parked, until_ms, priority .. ':' .. tenant)
end

-- Return a tenant from wherever it is parked (one of its runs ended). One ZMSCORE for the
-- ten priorities, so O(1). Returns whether it was parked anywhere.
local function flow_unpark_tenant(k, tenant)
  local members = {}
  for p = 0, 9 do members[p + 1] = p .. ':' .. tenant end
  local scores = redis.call('ZMSCORE', k.parked, unpack(members))
  local found = false
  for p = 0, 9 do
    if scores[p + 1] then
      redis.call('ZREM', k.parked, members[p + 1])
      flow_return(k, p, tenant)
      found = true
    end
  end
  return found
end

-- Return the parked entries `members` ('<priority>:<tenant>') to their rings.
local function flow_unpark_members(k, members)
  for _, member in ipairs(members) do
    redis.call('ZREM', k.parked, member)
    local p, tenant = string.match(member, '^(%d):(.*)$')
    if p then flow_return(k, p, tenant) end
  end
end

-- Return every parked tenant whose time has come (at most `limit`).
local function flow_unpark_due(k, now, limit)
  flow_unpark_members(k, redis.call('ZRANGE', k.parked, '-inf', now, 'BYSCORE', 'LIMIT', 0,
    limit))
end

-- Return every parked tenant (the limits changed).
local function flow_unpark_all(k)
  while true do
    local batch = redis.call('ZRANGE', k.parked, 0, 999)
    if #batch == 0 then return end
    flow_unpark_members(k, batch)
  end
end

-- Count runs that began: n runs, by_tenant = { tenant -> runs }.
local function flow_started(k, n, by_tenant)
  if n <= 0 then return end
  add_count(k.counts, 'running', n)
  for tenant, c in pairs(by_tenant) do
    if tenant ~= '' then add_count(k.running, tenant, c) end
  end
end

-- Count runs that ended (every way a run ends calls this): the slots go back, parked
-- tenants whose runs ended return to their rings, and when that may let a held job start
-- (the queue was at its cap, or a tenant came back) an idle worker is woken.
local function flow_ended(k, n, by_tenant)
  if n <= 0 then return end
  local left = add_count(k.counts, 'running', -n)
  if left < 0 then redis.call('HSET', k.counts, 'running', 0) end
  local freed = false
  for tenant, c in pairs(by_tenant) do
    if tenant ~= '' then
      if add_count(k.running, tenant, -c) <= 0 then
        redis.call('HDEL', k.running, tenant)
      end
      freed = flow_unpark_tenant(k, tenant) or freed
    end
  end
  if not freed then
    local cap = whole(redis.call('HGET', k.limits, 'concurrency'))
    freed = cap ~= nil and left + n >= cap
  end
  if freed and (tonumber(redis.call('HGET', k.counts, 'ready')) or 0) > 0 then
    wake_one(k.wake)
  end
end
