-- Handing new jobs straight to an idle worker, inside the enqueue that made them ready.
--
-- An idle worker with free slots registers as a waiter of a queue: its id in the waiters
-- zset, scored with when the registration lapses, and '<slots>:<nonce>' in the offers hash
-- (register_waiter.lua, and every fetch of the worker, which offers the slots it leaves
-- free). It then blocks on its hand-off list (handoff_prefix .. worker id) as well as the
-- wake key. An enqueue that finds a live waiter leases up to that many ready jobs to it
-- exactly as fetch does (same claim, limits, fencing tokens, running counts) and pushes
-- them, ready to run, onto the worker's hand-off list: the worker's blocking pop returns
-- them without a further round trip. A registration serves one enqueue, and lapses a few
-- seconds after the worker last renewed it. A job handed to a worker that died meanwhile
-- is leased like any other, so lease expiry brings it back; still on the list then, it
-- was never taken, and gets its attempt back (include/maintain.lua).
--@include ready
--@include key_types
--@include counter

-- Registrations are bookkeeping, as the wake key is: a waiters or offers key of the wrong
-- type is passed over, never failing the call (the worker is then handed nothing and
-- finds its jobs when woken; a registration without its offer is dropped when read).
local function drop_waiter(k, worker)
  redis.pcall('ZREM', k.waiters, worker)
  redis.pcall('HDEL', k.waiter_offers, worker)
end

local function offer_slots(k, worker, slots, nonce, now, ttl_ms)
  redis.pcall('ZADD', k.waiters, now + ttl_ms, worker)
  redis.pcall('HSET', k.waiter_offers, worker, slots .. ':' .. nonce)
end

-- A worker's registration after its fetch: the slots it offered are being filled, so it
-- now offers those the fetch left free, if any.
local function renew_waiter(k, worker, slots, nonce, now, ttl_ms)
  if worker == '' or not ttl_ms or ttl_ms <= 0 then return end  -- a worker not waiting
  if slots > 0 then
    offer_slots(k, worker, slots, nonce, now, ttl_ms)
  else
    drop_waiter(k, worker)
  end
end

-- The live waiter registered last (the likeliest still to be there), as { worker, slots,
-- nonce }; one whose offer is missing or mangled is removed and skipped. A waiters or
-- offers key of the wrong type reads as no waiter (the enqueue then wakes a worker).
local function live_waiter(k, now)
  for _ = 1, 3 do
    local found = redis.pcall('ZRANGE', k.waiters, '+inf', string.format('(%.3f', now),
      'BYSCORE', 'REV', 'LIMIT', 0, 1)
    if found.err or #found == 0 then return nil end
    local offer = redis.pcall('HGET', k.waiter_offers, found[1])
    if type(offer) == 'table' and offer.err then return nil end
    local slots, nonce = string.match(offer or '', '^(%d+):(%x+)$')
    slots = tonumber(slots)
    if slots and slots > 0 and slots <= 100000 then
      return { worker = found[1], slots = slots, nonce = nonce }
    end
    drop_waiter(k, found[1])
  end
  return nil
end

-- The hand-off itself: hand_off(k, cfg, now, want, w) leases up to `want` ready jobs to
-- waiter w as fetch.lua's claim does (limits included) and pushes them onto its list;
-- returns the number leased and whether limits apply. Built only when a waiter is found:
-- an enqueue that finds none does not pay for defining the claim's helpers.
local function hand_off_builder()
--@include records
--@include flow
--@include flow_claim
--@include lease
--@include metrics

  -- An unread hand-off list (its worker died) goes this long after its jobs' leases end:
  -- until then, the fetch that reclaims such a lease finds the job still on the list, so
  -- never taken, and gives its attempt back (include/maintain.lua).
  local HANDOFF_KEEP_MS = 600000

  -- One field of an entry: '<length>:<bytes>', so that any bytes pass unharmed.
  local function framed(parts, value)
    local text = tostring(value)
    parts[#parts + 1] = #text .. ':' .. text
  end

  -- The entry a waiter pops: now, the soonest deadline of its jobs ('' if none: the worker
  -- fetches then, include/expiry.lua), dead ids, trimmed ids (each a count, then the ids),
  -- then 10 fields per job as in fetch's reply.
  local function handoff_entry(now, out, jobs, soonest)
    local parts = {}
    framed(parts, string.format('%.3f', now))
    framed(parts, soonest and string.format('%d', soonest) or '')
    for _, ids in ipairs({ out.dead, out.trimmed }) do
      framed(parts, #ids)
      for _, id in ipairs(ids) do framed(parts, id) end
    end
    for _, value in ipairs(jobs) do framed(parts, value) end
    return table.concat(parts)
  end

  return function(k, cfg, now, want, w)
    local tally, acc = new_tally(), new_lease_batch(w.worker)
    local out = { dead = {}, trimmed = {}, expired = {} }
    local taken, _, lim = claim_ready(k, now, want, lease_taker(k, cfg, tally, out, now,
      want, w.nonce, acc))
    record_leases(k, tally, acc)
    flow_started(k, taken, acc.by_tenant)
    write_tally(tally, bucket_key(k.metrics_prefix, now, cfg.bucket_seconds), cfg.bucket_ttl)
    if taken > 0 or #out.dead > 0 then
      drop_waiter(k, w.worker)  -- a registration serves one enqueue
      local list = k.handoff_prefix .. w.worker
      redis.call('RPUSH', list, handoff_entry(now, out, acc.jobs, acc.soonest))
      local longest = 0
      for i = 9, #acc.jobs, LEASE_FIELDS do  -- each job's visibility timeout
        longest = math.max(longest, tonumber(acc.jobs[i]) or 0)
      end
      redis.call('PEXPIRE', list, longest + HANDOFF_KEEP_MS)
      if taken > 0 then add_count(k.counts, 'handed', taken) end
    end
    return taken, lim
  end
end

-- Whether a key the hand-off to waiter w would write holds the wrong type (key_types.lua),
-- or the token counter is no integer: the hand-off would stop half way, after the enqueue
-- stored its jobs, and fail the call (whose caller would store them again). The jobs stay
-- ready, and a worker is woken for them instead.
local function hand_off_refused(k, w)
  if wrong_key_type('enqueue', { k.leases, 'zset', k.dead, 'zset', k.active, 'hash',
      k.seq, 'string', k.events, 'stream', k.limits, 'hash', k.buckets, 'hash',
      k.running, 'hash', k.parked, 'zset', k.handoff_prefix .. w.worker, 'list' }) then
    return true
  end
  return not_a_counter(k.seq) ~= nil
end

-- After an enqueue made `n_ready` jobs ready: hand up to that many to a live waiter of the
-- queue, or (no waiter, paused, limits bind, nothing was made ready) wake a worker as
-- before; a waiter that got nothing (limits held the jobs) stays registered. A worker is
-- also woken when ready jobs remain after the hand-off. Returns the number handed over.
local function hand_off_or_wake(k, cfg, now, n_ready)
  local w = n_ready > 0 and live_waiter(k, now)
  if not w or redis.call('EXISTS', k.paused) == 1 or hand_off_refused(k, w) then
    wake_one(k.wake)
    return 0
  end
  local want = math.min(w.slots, n_ready)
  local taken, lim = hand_off_builder()(k, cfg, now, want, w)
  if taken == 0 or ((not lim or taken == want) and redis.call('ZCARD', k.priorities) > 0) then
    wake_one(k.wake)
  end
  return taken
end
