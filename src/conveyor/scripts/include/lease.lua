-- Leasing popped ids, for fetch: each lease gets a fresh fencing token (the queue's counter,
-- taken a range at a time, joined with the call's nonce); counts are written once per call.
--@include job_record
--@include metrics
--@include records

local function new_lease_batch()
  return { jobs = {}, leases = {}, active = {}, by_tenant = {}, popped_ready = 0,
    token_base = 0, tokens_left = 0 }
end

-- A function that leases one popped id if it is a ready job and says whether it did.
-- Cancelled jobs are dropped here (their ready count was taken off at cancel); a missing
-- record (expired) or a stray entry of a job held elsewhere is skipped; a record that
-- cannot run, or that nothing else holds, is dead-lettered.
local function lease_taker(k, cfg, tally, out, now, want, nonce, acc)
  return function(id)
    local key = k.job_prefix .. id
    local r = read_record(key, true)
    -- A cancelled job's record starts to expire now that no list names it (see cancel.lua).
    if r.state == 'cancelled' then
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
    if acc.tokens_left == 0 then
      acc.token_base = redis.call('INCRBY', k.seq, want) - want
      acc.tokens_left = want
    end
    acc.token_base, acc.tokens_left = acc.token_base + 1, acc.tokens_left - 1
    local attempts = (tonumber(r.attempts) or 0) + 1
    local token = string.format('%d', acc.token_base) .. '.' .. nonce
    local vt = tonumber(r.vt) or DEFAULT_VT
    redis.call('HSET', key, 's', 'active', 'attempts', attempts, 'token', token)
    acc.leases[#acc.leases + 1] = now + vt
    acc.leases[#acc.leases + 1] = id
    acc.active[r.task] = (acc.active[r.task] or 0) + 1
    local tenant = r.tenant or ''
    if tenant ~= '' then acc.by_tenant[tenant] = (acc.by_tenant[tenant] or 0) + 1 end
    local jobs, n = acc.jobs, #acc.jobs
    jobs[n + 1], jobs[n + 2], jobs[n + 3], jobs[n + 4] = id, token, r.task, r.args or ''
    jobs[n + 5], jobs[n + 6] = attempts, r.max_attempts or DEFAULT_MAX_ATTEMPTS
    jobs[n + 7], jobs[n + 8], jobs[n + 9] = r.enqueued_ms or '', r.run_at or '', vt
    return true
  end
end

-- Write what a batch of leases changes: ready count, lease deadlines, active per task.
local function record_leases(k, tally, acc)
  if acc.popped_ready > 0 then redis.call('HINCRBY', k.counts, 'ready', -acc.popped_ready) end
  for i = 1, #acc.leases, 500 do
    redis.call('ZADD', k.leases, unpack(acc.leases, i, math.min(i + 499, #acc.leases)))
  end
  for task, n in pairs(acc.active) do
    redis.call('HINCRBY', k.active, task, n)
    count(tally, task, 'started', n)
  end
end
