-- Housekeeping that every fetch does first, so no separate reaper or scheduler is needed:
-- promote delayed jobs that have come due, and reclaim leases whose deadline has passed.
--@include job_record
--@include counter
--@include clock
--@include finish
--@include flow
--@include metrics
--@include ready
--@include records
--@include expiry

-- Move due delayed jobs to the front of their ready lists, earliest due first: they have
-- already waited, so they go ahead of jobs of their priority and tenant queued without delay.
local function promote_due(k, now, limit, cfg, tally, out)
  local due = redis.call('ZRANGE', k.delayed, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  local promoted = 0
  for i = #due, 1, -1 do
    local id = due[i]
    redis.call('ZREM', k.delayed, id)
    local r = read_record(k.job_prefix .. id)
    local bad = listed_record_problem(k.job_prefix .. id, r)
    if not bad and r.state ~= 'scheduled' and r.state ~= 'retrying'
        and r.state ~= 'suspended' then
      bad = stranded(k, id, r)  -- (its delayed entry, the one we met, is already removed)
    end
    if bad then
      dead_letter(k, cfg, tally, now, id, r, bad, out)
    elseif r.state == 'suspended' then
      -- A durable wait's time came (a sleep's end, a timeout): the run that takes it next
      -- records the wait's outcome (wait.lua).
      redis.pcall('SREM', k.suspended, id)  -- an index: a key written over is passed over
      add_count(k.counts, 'suspended', -1)
      add_count(k.counts, 'suspended_timed', -1)  -- it was in the delayed set: it had a timer
      redis.call('HSET', k.job_prefix .. id, 's', 'ready')
      push_ready(k.ready_prefix, k.ring_prefix, k.priorities, id, r.priority or '5',
        r.tenant or '', true)
      promoted = promoted + 1
    elseif r.state == 'scheduled' or r.state == 'retrying' or r.state == 'ready' then
      -- 'ready' here is a record changed by hand, in no ready list that we can see: it is
      -- listed (were it listed already, the second entry meets it leased, and is skipped).
      redis.call('HSET', k.job_prefix .. id, 's', 'ready')
      push_ready(k.ready_prefix, k.ring_prefix, k.priorities, id, r.priority or '5',
        r.tenant or '', true)
      promoted = promoted + 1
    end
  end
  if promoted > 0 then add_count(k.counts, 'ready', promoted) end
  return promoted
end

-- A job someone asked to cancel whose holder died before it learned of it: it ends
-- cancelled now rather than run again; expired when its deadline passed (the timer asked).
local function cancel_lapsed(k, cfg, tally, now, id, r, out)
  local finished_at = seconds(now)
  local deadline = tonumber(redis.call('HGET', k.job_prefix .. id, 'dl'))
  local state = (deadline and now >= deadline) and 'expired' or 'cancelled'
  if state == 'expired' then
    count(tally, r.task, 'expired', 1)
    out.expired[#out.expired + 1] = id
  end
  redis.call('HSET', k.job_prefix .. id, 's', state, 'token', '', 'error', r.cancel,
    'finished_at', finished_at)
  redis.call('EXPIRE', k.job_prefix .. id, tonumber(r.cancel_ttl) or 86400)
  free_dedupe_key(k.dedupe_prefix, r.key, id)
  emit_event(k.events, cfg.events_maxlen, id, { task = r.task, state = state,
    attempts = r.attempts or '0', enqueued_ms = r.enqueued_ms, run_at = r.run_at,
    started_at = r.started_at, finished_at = finished_at, tenant = r.tenant, error = r.cancel,
    trace = r.trace })
  hand_over(k.job_prefix, id, now)
end

-- Set every task's active count, and the running counts of flow control (the queue's and
-- each tenant's), to what the leased jobs' records say. Only needed when a leased job's
-- record vanished or was changed by hand (so which counts it holds is unknown):
-- O(leases), on that rare path only.
local function recount_active(k)
  local counts, tenants, running = {}, {}, 0
  for _, id in ipairs(redis.call('ZRANGE', k.leases, 0, -1)) do
    local f = redis.pcall('HMGET', k.job_prefix .. id, 's', 't', 'tenant')  -- maybe no hash
    if f[1] == 'active' then
      counts[f[2] or ''] = (counts[f[2] or ''] or 0) + 1
      running = running + 1
      if f[3] and f[3] ~= '' then tenants[f[3]] = (tenants[f[3]] or 0) + 1 end
    end
  end
  for _, task in ipairs(redis.call('HKEYS', k.active)) do
    redis.call('HSET', k.active, task, counts[task] or 0)
    counts[task] = nil
  end
  for task, n in pairs(counts) do redis.call('HSET', k.active, task, n) end
  redis.call('HSET', k.counts, 'running', running)
  redis.call('DEL', k.running)
  for tenant, n in pairs(tenants) do redis.call('HSET', k.running, tenant, n) end
end

-- A leased job whose record no longer says 'active' was changed by something other than
-- conveyor: its lease entry and active count date from when it was leased, so the count
-- is given back, and a record left in no final state is dead-lettered with the reason.
-- Returns true when the record no longer names its task, so the counts need a recount.
local function reclaim_mangled(k, now, cfg, tally, id, r, out)
  -- Which count it holds is unknown when it names no task, or one whose count is empty.
  local unknown = r.task == '' or release_active(k.active, r.task)
  if r.state ~= 'succeeded' and r.state ~= 'cancelled' then
    local reason = record_problem(r) or ("corrupt record: a leased job's field 'state' is "
      .. (r.state and quoted(r.state) or 'missing'))
    dead_letter(k, cfg, tally, now, id, r, reason, out)
  end
  return unknown
end

-- Whether the lease of the job under `key` was handed to an idle worker by an enqueue
-- (include/handoff.lua) that never took it: the entry carrying its token is still on the
-- hand-off list of the worker its record names (field 'w') (the worker died or stopped before its pop). Such a lease used no
-- attempt. The list is named as keys.py names it, from the queue's hash tag.
-- The entry leaves the list: a worker that was only slow (its pop held up on the way) must
-- not pop it later and run the job under a lease the refund ended. Other jobs of that
-- entry, reclaimed later, are then charged as leases that were taken.
local function never_taken(k, key)
  local f = redis.call('HMGET', key, 'w', 'token')
  local worker, token = f[1], f[2]
  if not worker or not token or token == '' then return false end
  local list = string.match(k.job_prefix, '^{[^}]*}') .. ':handoff:' .. worker
  local entries = redis.pcall('LRANGE', list, 0, -1)
  if entries.err then return false end
  local framed = #token .. ':' .. token
  for _, entry in ipairs(entries) do
    if string.find(entry, framed, 1, true) then
      redis.call('LREM', list, 1, entry)
      return true
    end
  end
  return false
end

-- A reclaimed job goes back to the front of its ready list; `field`, `value` go on its
-- record (the error that ended its lease, or the attempts it is left with).
local function back_to_ready(k, id, r, field, value)
  redis.call('HSET', k.job_prefix .. id, 's', 'ready', 'token', '', field, value)
  push_ready(k.ready_prefix, k.ring_prefix, k.priorities, id, r.priority or '5',
    r.tenant or '', true)
  add_count(k.counts, 'ready', 1)
end

-- Whether the run of the lease now on the record under `key` was known to begin: its
-- holder told so with a heartbeat (heartbeat.lua keeps the lease's token as 'rs').
local function run_began(key)
  local f = redis.call('HMGET', key, 'token', 'rs')
  return f[1] ~= nil and f[1] ~= '' and f[1] == f[2]
end

-- A lease past its deadline means the worker died or stalled. The attempt it used counts
-- when its run was known to begin; otherwise (the worker died before it began the run, or
-- before it told so, which it does within a second or so) the attempt is given back and
-- the record counts the lease as 'lu', so that its next run tells its start before it
-- begins (include/lease.lua): a job that kills its worker as it starts is charged from
-- then on. A lease its worker never took (a hand-off) goes back as it was before it.
-- The job goes back to the front of its list, or to the dead letters when attempts are
-- spent (added to out.dead, with any dead letters the cap trimmed in out.trimmed).
local function reclaim_expired(k, now, limit, cfg, tally, out)
  local expired = redis.call('ZRANGE', k.leases, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  local recount = false
  for _, id in ipairs(expired) do
    redis.call('ZREM', k.leases, id)
    local key = k.job_prefix .. id
    local r = read_record(key)
    local began = r.state == 'active' and run_began(key)
    local attempts = tonumber(r.attempts or '1') or 1
    if r.state == 'active' and r.cancel then
      if release_active(k.active, r.task) then recount = true end
      flow_ended(k, 1, { [r.tenant or ''] = 1 })
      add_count(key, 'lost', 1)
      if not began then
        redis.call('HSET', key, 'attempts', math.max(0, attempts - 1))
        add_count(key, 'lu', 1)
      end
      cancel_lapsed(k, cfg, tally, now, id, r, out)
    elseif r.state == 'active' then
      if release_active(k.active, r.task) then recount = true end
      flow_ended(k, 1, { [r.tenant or ''] = 1 })
      local untaken = never_taken(k, key)
      if not untaken then
        add_count(key, 'lost', 1)  -- leases lost, on the record: what a lost lease cost
        if began then count(tally, r.task, 'failed', 1) else add_count(key, 'lu', 1) end
      end
      local err = 'lease expired: the worker died or stalled (attempt ' .. attempts .. ')'
      local bad = record_problem(r)
      if bad then
        dead_letter(k, cfg, tally, now, id, r, bad, out)
      elseif not began then  -- nor did its run begin, whatever the lease set started_at to
        back_to_ready(k, id, r, 'attempts', math.max(0, attempts - 1))
        redis.call('HDEL', key, 'started_at')
      elseif attempts >= (tonumber(r.max_attempts) or DEFAULT_MAX_ATTEMPTS) then
        dead_letter(k, cfg, tally, now, id, r, err, out)
      else
        back_to_ready(k, id, r, 'error', err)
        count(tally, r.task, 'retried', 1)
      end
      rearm_expiry(k.expiring, id, redis.call('HGET', key, 'x'))
    elseif r.state == nil and redis.call('EXISTS', key) == 0 then
      recount = true
    else
      reclaim_mangled(k, now, cfg, tally, id, r, out)
      -- Its task field may have been changed or lost since it was leased: the count it
      -- holds is under a task name the record no longer tells.
      recount = true
    end
  end
  if recount then recount_active(k) end
end
