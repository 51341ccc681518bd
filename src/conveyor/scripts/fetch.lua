#!lua
-- Lease up to `count` ready jobs to a worker, after promoting due delayed jobs and
-- reclaiming expired leases. Each leased job gets a fresh fencing token: the queue's
-- counter joined with a random nonce of this call, so that a token is never handed out
-- twice, also after Redis rolled back to an older state (failover to a lagging replica,
-- restore from a snapshot) and its counter with it.
-- A record that cannot be run as it stands (a field that must be a number is not, a
-- state that is no job state) is dead-lettered here with a reason naming the field.
--
-- KEYS[1]  job_prefix
-- KEYS[2]  ready_prefix
-- KEYS[3]  ring_prefix
-- KEYS[4]  priorities
-- KEYS[5]  delayed
-- KEYS[6]  leases
-- KEYS[7]  dead
-- KEYS[8]  counts
-- KEYS[9]  active
-- KEYS[10] seq
-- KEYS[11] dedupe_prefix
-- KEYS[12] events
-- KEYS[13] metrics_prefix
-- KEYS[14] wake
-- KEYS[15] paused
-- ARGV[1] now             '' for the server clock (ms override, tests only)
-- ARGV[2] count           most jobs to lease (the worker's free slots)
-- ARGV[3] dead_cap        most dead letters kept
-- ARGV[4] events_maxlen   approximate cap of the events stream
-- ARGV[5] bucket_seconds  width of a metric bucket
-- ARGV[6] bucket_ttl      lifetime of a metric bucket (s)
-- ARGV[7] nonce           random text of this call, part of every token it hands out
-- Returns: { now_ms, next_due_ms ('' if none), dead short ids (lost leases, bad records),
--            jobs: flat, 9 fields each: short id, token, task, args, attempts,
--            max_attempts, enqueued_at, run_at, vt;
--            short ids of dead letters deleted by the cap meanwhile }
--@include clock
--@include ready
--@include metrics
--@include finish
--@include records
--@include maintain

local k = { job_prefix = KEYS[1], ready_prefix = KEYS[2], ring_prefix = KEYS[3],
  priorities = KEYS[4], delayed = KEYS[5], leases = KEYS[6], dead = KEYS[7],
  counts = KEYS[8], active = KEYS[9], seq = KEYS[10], dedupe_prefix = KEYS[11],
  events = KEYS[12], metrics_prefix = KEYS[13], wake = KEYS[14], paused = KEYS[15] }
local want, nonce = tonumber(ARGV[2]), ARGV[7]
local cfg = { dead_cap = tonumber(ARGV[3]), events_maxlen = tonumber(ARGV[4]),
  bucket_seconds = tonumber(ARGV[5]), bucket_ttl = tonumber(ARGV[6]) }
if not want or want < 0 or not cfg.dead_cap or not cfg.events_maxlen
    or not cfg.bucket_seconds or not cfg.bucket_ttl then
  return redis.error_reply('ERR fetch: count, dead_cap, events_maxlen, bucket_seconds and '
    .. 'bucket_ttl must be numbers')
end
if not nonce or nonce == '' then return redis.error_reply('ERR fetch: nonce must be set') end

local now = now_ms(ARGV[1])
local tally = new_tally()
local out = { dead = {}, trimmed = {} }
reclaim_expired(k, now, 100, cfg, tally, out)
promote_due(k, now, 1000, cfg, tally, out)

local jobs, taken, leases, active = {}, 0, {}, {}
if redis.call('EXISTS', k.paused) == 0 then
  local popped_ready = 0
  while taken < want do
    local ids = pop_ready_many(k.ready_prefix, k.ring_prefix, k.priorities, want - taken)
    if #ids == 0 then break end
    local token_base = redis.call('INCRBY', k.seq, #ids) - #ids
    for i, id in ipairs(ids) do
      local key = k.job_prefix .. id
      local r = read_record(key)
      -- Cancelled jobs are removed lazily here; their ready count was taken off at cancel,
      -- and their record starts to expire now that no list names it.
      if r.state == 'cancelled' then
        redis.call('EXPIRE', key, tonumber(redis.call('HGET', key, 'keep')) or 86400)
      else
        popped_ready = popped_ready + 1
      end
      -- A missing record (expired) or one of another state (a stale entry) is skipped.
      local bad = listed_record_problem(key, r) or stranded(k, id, r)
      if bad then
        dead_letter(k, cfg, tally, now, id, r, bad, out)
      elseif r.state == 'ready' then
        local f = redis.call('HMGET', key, 'state', 'task', 'args', 'attempts', 'max_attempts',
          'enqueued_at', 'run_at', 'vt')
        local attempts = (tonumber(f[4]) or 0) + 1
        local token = string.format('%d', token_base + i) .. '.' .. nonce
        local vt = tonumber(f[8]) or 30000
        local task = f[2] or ''
        redis.call('HSET', key, 'state', 'active', 'attempts', attempts, 'token', token)
        leases[#leases + 1] = now + vt
        leases[#leases + 1] = id
        active[task] = (active[task] or 0) + 1
        local n = #jobs
        jobs[n + 1], jobs[n + 2], jobs[n + 3], jobs[n + 4] = id, token, task, f[3] or ''
        jobs[n + 5], jobs[n + 6], jobs[n + 7] = attempts, f[5] or '1', f[6] or ''
        jobs[n + 8], jobs[n + 9] = f[7] or '', vt
        taken = taken + 1
      end
    end
  end
  if popped_ready > 0 then redis.call('HINCRBY', k.counts, 'ready', -popped_ready) end
  for i = 1, #leases, 500 do
    redis.call('ZADD', k.leases, unpack(leases, i, math.min(i + 499, #leases)))
  end
  for task, n in pairs(active) do
    redis.call('HINCRBY', k.active, task, n)
    count(tally, task, 'started', n)
  end
  if taken > 0 and redis.call('ZCARD', k.priorities) > 0 then wake_one(k.wake) end
end
write_tally(tally, bucket_key(k.metrics_prefix, now, cfg.bucket_seconds), cfg.bucket_ttl)

local next_due = ''
local first_delayed = redis.call('ZRANGE', k.delayed, 0, 0, 'WITHSCORES')
local first_lease = redis.call('ZRANGE', k.leases, 0, 0, 'WITHSCORES')
if #first_delayed > 0 then next_due = tonumber(first_delayed[2]) end
if #first_lease > 0 and (next_due == '' or tonumber(first_lease[2]) < next_due) then
  next_due = tonumber(first_lease[2])
end
return { string.format('%.3f', now), next_due == '' and '' or string.format('%.3f', next_due),
  out.dead, jobs, out.trimmed }
