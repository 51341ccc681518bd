-- The claim under limits: which ready jobs may start now (see flow.lua for the data).
--@include flow
--@include ready

-- What a tenant may start now: { room = jobs (math.huge: no limit), rate = its rate or
-- nil, tokens = its bucket's tokens }; `already` jobs of it were leased by this call.
-- '' (no tenant) obeys the queue's limits only.
local function tenant_room(k, lim, tenant, now, already)
  if tenant == '' then return { room = math.huge } end
  local f = redis.call('HMGET', k.limits, 'c:' .. tenant, 'r:' .. tenant)
  local cap = whole(f[1]) or lim.tenant_concurrency
  local rate = tonumber(f[2]) or lim.tenant_rate
  if rate and not (rate > 0 and rate < math.huge) then rate = nil end
  local t = { room = math.huge, rate = rate }
  if cap then
    t.room = cap - (whole(redis.call('HGET', k.running, tenant)) or 0) - already
  end
  if rate then
    t.tokens = bucket_tokens(redis.call('HGET', k.buckets, 't:' .. tenant), rate, now)
    t.room = math.min(t.room, whole_tokens(t.tokens))
  end
  return t
end

-- Park a tenant that cannot start a job now: until its bucket refills when tokens are what
-- it lacks, else (its cap) until one of its runs ends, re-checked now and then.
local function park_tenant(k, p, tenant, t, now)
  local until_ms = now + FLOW_RECHECK_MS
  if t.rate and whole_tokens(t.tokens) < 1 and t.room <= 0 then
    until_ms = bucket_refill_at(t.tokens, t.rate, now)
  end
  flow_park(k, p, tenant, until_ms)
end

-- Lease up to `want` jobs obeying the limits `lim`; take(id) leases one popped id and says
-- whether it did (a cancelled or stale entry is not leased). Returns the number leased and
-- when (ms) the queue's bucket has a token again if the queue's rate held jobs back.
local function claim_limited(k, lim, now, want, take)
  local room = want
  if lim.concurrency then
    room = math.min(room, lim.concurrency - (whole(redis.call('HGET', k.counts, 'running')) or 0))
  end
  local qtokens
  if lim.rate then
    qtokens = bucket_tokens(redis.call('HGET', k.buckets, ''), lim.rate, now)
    room = math.min(room, whole_tokens(qtokens))
  end
  local leased, mine = 0, {}
  while leased < room do
    local top = redis.call('ZRANGE', k.priorities, 0, 0, 'REV')
    if #top == 0 then break end
    local p = top[1]
    local ring = k.ring_prefix .. p
    local tenant = redis.call('LPOP', ring)
    if not tenant then
      redis.call('ZREM', k.priorities, p)
    else
      local list = k.ready_prefix .. p .. ':' .. tenant
      local t = tenant_room(k, lim, tenant, now, mine[tenant] or 0)
      if t.room <= 0 then
        if list_call('LLEN', list) > 0 then park_tenant(k, p, tenant, t, now) end
      else
        -- Alone at its level, a tenant takes a run of jobs at once (nobody to be fair to).
        local n = 1
        if redis.call('LLEN', ring) == 0 then n = math.min(t.room, room - leased) end
        local ids = list_call('LPOP', list, n) or {}
        local got = 0
        for _, id in ipairs(ids) do
          if take(id) then got = got + 1 end
        end
        leased = leased + got
        if got > 0 then
          mine[tenant] = (mine[tenant] or 0) + got
          t.room = t.room - got
          if t.rate then
            t.tokens = t.tokens - got
            bucket_store(k.buckets, 't:' .. tenant, t.tokens, now)
          end
        end
        if list_call('LLEN', list) > 0 then
          if t.room > 0 then redis.call('RPUSH', ring, tenant)
          else park_tenant(k, p, tenant, t, now) end
        end
      end
      -- Keep priorities exact: a level whose every tenant is parked or empty leaves it.
      if redis.call('LLEN', ring) == 0 then redis.call('ZREM', k.priorities, p) end
    end
  end
  local refill
  if lim.rate then
    if leased > 0 then bucket_store(k.buckets, '', qtokens - leased, now) end
    local left = qtokens - leased
    if whole_tokens(left) < 1 then refill = bucket_refill_at(left, lim.rate, now) end
  end
  return leased, refill
end

-- Lease up to `want` ready jobs with take(id), under the queue's limits when it has any
-- (claim_limited) or straight from the ready lists when not, once the inbox's jobs are on
-- their lists: what fetch and a hand-off both claim with. Returns the number leased, the
-- queue bucket's refill time (or nil) and the limits (nil when none).
local function claim_ready(k, now, want, take)
  absorb_inbox(k.ready_prefix, k.ring_prefix, k.priorities)
  local lim = read_limits(k.limits)
  if lim then
    flow_unpark_due(k, now, 1000)
    local taken, refill = claim_limited(k, lim, now, want, take)
    return taken, refill, lim
  end
  local taken = 0
  while taken < want do
    local ids = pop_ready_many(k.ready_prefix, k.ring_prefix, k.priorities, want - taken)
    if #ids == 0 then break end
    for _, id in ipairs(ids) do
      if take(id) then taken = taken + 1 end
    end
  end
  return taken, nil, nil
end
