-- Leasing popped ids, for fetch: each lease gets a fresh fencing token (the queue's counter,
-- taken a range at a time, joined with the call's nonce); counts are written once per call.
--@include job_record
--@include counter
--@include metrics
--@include records
--@include expiry

-- Fields of each leased job in a reply (fetch, a hand-off entry): id, token, task, args,
-- attempts, max attempts, enqueued ms, run at, visibility ms, and whether to tell the start.
local LEASE_FIELDS = 10

-- holder: the id of the worker that fetched these leases, or that an enqueue hands them to
-- (include/handoff.lua); '' when the caller named none. A leased record names its holder
-- in the one short field 'w' (read only while the job is active: JobInfo.worker), so that
-- a lease its worker never took off a hand-off list is told apart when it expires
-- (include/maintain.lua). 'started_at' is set too, so that a running job shows since when
-- it runs; the run's finish writes the time its function really began.
local function new_lease_batch(holder)
  return { jobs = {}, leases = {}, active = {}, by_tenant = {}, popped_ready = 0,
    token_base = 0, tokens_left = 0, holder = holder or '', off_timer = {} }
end

-- Lease one ready job: a fresh token, the record active, its deadline, and its fields in
-- the reply. `f` holds the record's fields as lease_ready reads them.
local function grant(k, acc, now, want, nonce, id, key, f)
  if acc.tokens_left == 0 then
    acc.token_base = redis.call('INCRBY', k.seq, want) - want
    acc.tokens_left = want
  end
  acc.token_base, acc.tokens_left = acc.token_base + 1, acc.tokens_left - 1
  local attempts = (tonumber(f[3]) or 0) + 1
  local token = string.format('%d', acc.token_base) .. '.' .. nonce
  local vt = tonumber(f[5]) or DEFAULT_VT
  if acc.holder ~= '' then
    redis.call('HSET', key, 's', 'active', 'attempts', attempts, 'token', token, 'w',
      acc.holder, 'started_at', string.format('%.3f', now / 1000))
  else
    redis.call('HSET', key, 's', 'active', 'attempts', attempts, 'token', token,
      'started_at', string.format('%.3f', now / 1000))
  end
  local leases, nl = acc.leases, #acc.leases
  leases[nl + 1], leases[nl + 2] = now + vt, id
  local task = f[6] or ''
  acc.active[task] = (acc.active[task] or 0) + 1
  local tenant = f[7]
  if tenant and tenant ~= '' then acc.by_tenant[tenant] = (acc.by_tenant[tenant] or 0) + 1 end
  local jobs, n = acc.jobs, #acc.jobs
  jobs[n + 1], jobs[n + 2], jobs[n + 3], jobs[n + 4] = id, token, task, f[10] or ''
  jobs[n + 5], jobs[n + 6] = attempts, f[4] or DEFAULT_MAX_ATTEMPTS
  jobs[n + 7], jobs[n + 8], jobs[n + 9] = f[8] or '', f[9] or '', vt
  -- A job that lost a lease before its run was known to begin (include/maintain.lua)
  -- tells this run's start before it begins: one that kills its worker is then charged.
  jobs[n + 10] = (tonumber(f[13]) or 0) > 0 and '1' or ''
end

-- Lease a popped id whose record is a ready job that record_problem would find nothing
-- wrong with (runnable_fields, the same rules), reading only the fields a lease needs,
-- into no table of names: the path of almost every job. Anything else (another state, a
-- bad field, no record, a key that holds no hash) returns false, for the careful path that
-- reads the record whole.
-- A job past the time it must start by ('x', include/expiry.lua) is not leased: it ends
-- expired here ('expired' is returned), whatever the timer has done yet. One leased with a
-- deadline keeps its timer, at the deadline; one without has none left to keep.
local function lease_ready(k, acc, now, want, nonce, id, key)
  local f = redis.pcall('HMGET', key, 's', 'p', 'attempts', 'm', 'v', 't', 'tenant', 'e',
    'run_at', 'a', 'x', 'dl', 'lu')
  if f[1] ~= 'ready' or not runnable_fields(f[2], f[3], f[4], f[5]) then return false end
  acc.popped_ready = acc.popped_ready + 1
  if f[11] then
    if now >= (tonumber(f[11]) or now) then return 'expired' end
    local deadline = tonumber(f[12])
    if deadline then
      soft_call('ZADD', k.expiring, deadline, id)
      if not acc.soonest or deadline < acc.soonest then acc.soonest = deadline end
    else
      acc.off_timer[#acc.off_timer + 1] = id  -- off the timer with the batch's leases
    end
  end
  grant(k, acc, now, want, nonce, id, key, f)
  return true
end

-- A function that leases one popped id if it is a ready job and says whether it did.
-- Cancelled jobs are dropped here (their ready count was taken off at cancel); a missing
-- record (expired) or a stray entry of a job held elsewhere is skipped; a record that
-- cannot run, or that nothing else holds, is dead-lettered.
local function lease_taker(k, cfg, tally, out, now, want, nonce, acc)
  return function(id)
    local key = k.job_prefix .. id
    local leased = lease_ready(k, acc, now, want, nonce, id, key)
    if leased == 'expired' then
      end_expired(k, cfg, tally, now, id, expiry_fields(key), false, out)
      return false
    elseif leased then
      return true
    end
    local r = read_record(key, true)
    -- A cancelled or expired job's record starts to expire now that no list names it (see
    -- cancel.lua, include/expiry.lua).
    if r.state == 'cancelled' or r.state == 'expired' then
      redis.call('EXPIRE', key, tonumber(redis.call('HGET', key, 'keep')) or 86400)
    else
      acc.popped_ready = acc.popped_ready + 1
    end
    local bad = listed_record_problem(key, r) or stranded(k, id, r)
    if bad then
      dead_letter(k, cfg, tally, now, id, r, bad, out)
      return false
    end
    if r.state ~= 'ready' then return false end
    -- A ready record without a problem: lease_ready, checking by the same rules, has
    -- taken it already; should that ever change, it is leased here rather than dropped.
    grant(k, acc, now, want, nonce, id, key, { r.state, r.priority, r.attempts,
      r.max_attempts, r.vt, r.task, r.tenant, r.enqueued_ms, r.run_at, r.args, nil, nil,
      redis.call('HGET', key, 'lu') })
    return true
  end
end

-- Write what a batch of leases changes: ready count, lease deadlines, active per task.
local function record_leases(k, tally, acc)
  if acc.popped_ready > 0 then add_count(k.counts, 'ready', -acc.popped_ready) end
  for i = 1, #acc.leases, 500 do
    redis.call('ZADD', k.leases, unpack(acc.leases, i, math.min(i + 499, #acc.leases)))
  end
  for i = 1, #acc.off_timer, 500 do  -- started in time, with no deadline to keep
    soft_call('ZREM', k.expiring, unpack(acc.off_timer, i, math.min(i + 499,
      #acc.off_timer)))
  end
  for task, n in pairs(acc.active) do
    add_count(k.active, task, n)
    count(tally, task, 'started', n)
  end
end
