#!lua
--!df flags=allow-undeclared-keys
-- Record the outcome of a batch of attempts: success, failure (retry with a delay, or dead
-- when attempts are spent), dead at once (unknown task, corrupt payload), snoozed (the
-- attempt given back; dead past the cap), suspended at a durable wait (the attempt given
-- back, include/suspend.lua) or cancelled. A job someone asked to cancel ends
-- cancelled whatever its run reports (a late result or retry is refused).
-- An outcome is accepted only with the fencing token of the job's current lease: a worker
-- whose lease expired and was taken over cannot record anything, so one success is kept.
--
-- K.job_prefix
-- K.leases
-- K.delayed
-- K.dead
-- K.active
-- K.idle
-- K.dedupe_prefix
-- K.events
-- K.metrics_prefix
-- K.wake
-- K.counts
-- K.running
-- K.parked
-- K.limits
-- K.ready_prefix
-- K.ring_prefix
-- K.priorities
-- K.suspended
-- K.expiring
-- A.now                   '' for the server clock (ms override, tests only)
-- A.retention             seconds a finished job record (and its result) is kept
-- A.dead_cap              most dead letters kept
-- A.events_maxlen         approximate cap of the events stream
-- A.bucket_seconds        width of a metric bucket
-- A.bucket_ttl            lifetime of a metric bucket (s)
-- A.snooze_cap            most snoozes of a job; one more makes it dead
-- A.outcomes              number of outcomes that follow, 6 fields each:
--         short id, token, outcome ('ok' | 'retry' | 'dead' | 'snooze' | 'cancelled' |
--         'suspend'),
--         started_at (epoch s; 0 for a cancelled job whose run never began: its lease
--         used no attempt), payload (encoded result for 'ok', error text otherwise),
--         retry_delay_ms (the delay of a retry or a snooze)
-- Returns: { codes: one per outcome, 0 refused (stale token), 1 succeeded, 2 retrying,
--            3 dead, 4 cancelled, 5 snoozed, 6 suspended (7 when the wait was already
--            over, so the job is ready again), 8 expired (cancelled as its deadline
--            passed, include/expiry.lua); short ids trimmed from the dead letters by
--            the cap; how many of the jobs that ended were workflow nodes queued for
--            hand-over }
--@include clock
--@include metrics
--@include finish
--@include ready
--@include settle
--@include flow
--@include key_types

local job_prefix, leases, delayed, dead = K.job_prefix, K.leases, K.delayed, K.dead
local dedupe_prefix, events = K.dedupe_prefix, K.events
local retention, dead_cap = tonumber(A.retention), tonumber(A.dead_cap)
local events_maxlen = tonumber(A.events_maxlen)
local bucket_seconds, bucket_ttl = tonumber(A.bucket_seconds), tonumber(A.bucket_ttl)
local snooze_cap, n = tonumber(A.snooze_cap), tonumber(A.outcomes)
local FIELDS, FIRST = ITEM.fields, ITEM.first
if not (retention and dead_cap and events_maxlen and bucket_seconds and bucket_ttl and n
    and snooze_cap) or #ARGV ~= FIRST - 1 + n * FIELDS then
  return redis.error_reply('ERR finish: expected numeric settings and ' .. tostring(n)
    .. ' outcomes of ' .. FIELDS .. ' fields')
end
local unknown = unknown_outcome(n)
if unknown then return redis.error_reply('ERR finish: unknown outcome ' .. unknown) end
local wrong = wrong_key_type('finish', { leases, 'zset', delayed, 'zset', dead, 'zset',
  K.active, 'hash', K.idle, 'hash', events, 'stream', K.counts, 'hash', K.running, 'hash',
  K.parked, 'zset', K.limits, 'hash', K.priorities, 'zset', handover_key(job_prefix),
  'list' })
if wrong then return redis.error_reply(wrong) end

local now = now_ms(A.now)
local now_s = seconds(now)
local codes, trimmed, retried, handed = {}, {}, false, 0
local tally, done_leases, done_tasks, done_tenants = new_tally(), {}, {}, {}
for i = 0, n - 1 do
  local base = FIRST + i * FIELDS
  local id, token = ARGV[base + ITEM.short_id], ARGV[base + ITEM.token]
  local outcome, payload = ARGV[base + ITEM.outcome], ARGV[base + ITEM.payload]
  local started_at = run_began_at(ARGV[base + ITEM.started_at], now, now_s)
  local unstarted = tonumber(started_at) == 0
  local key = job_prefix .. id
  -- A record that is no hash (written over by hand) reads as an error: refused, like a
  -- stale token; its lease expires and the fetch that reclaims it dead-letters it.
  local f = redis.pcall('HMGET', key, 's', 'token', 't', 'attempts', 'm', 'key', 'e',
    'run_at', 'tenant', 'p', 'cancel', 'snoozes', 'tr', 'wf', 'pw', 'x', 'dl', 'error')
  if f[1] ~= 'active' or f[2] ~= token then
    codes[#codes + 1] = 0
  else
    -- The event's fields are gathered only for a queue that streams (see emit_event).
    local task, state, err = f[3] or '', nil, nil
    done_leases[#done_leases + 1] = id
    done_tasks[task] = (done_tasks[task] or 0) + 1
    done_tenants[f[9] or ''] = (done_tenants[f[9] or ''] or 0) + 1
    outcome, payload = final_outcome(outcome, payload, f, snooze_cap, now)
    if outcome ~= 'snooze' and outcome ~= 'suspend' and not unstarted then
      observe_run(tally, task, f, started_at, now)
    end
    local due = now + (tonumber(ARGV[base + ITEM.retry_delay_ms]) or 0)
    if outcome == 'ok' then
      state = 'succeeded'
      settle_succeeded(key, payload, started_at, now_s, retention, f[18])
      count(tally, task, 'succeeded', 1)
      codes[#codes + 1] = 1
    elseif outcome == 'retry' then
      settle_retrying(key, delayed, id, payload, started_at, now_s, due)
      count(tally, task, 'failed', 1)
      count(tally, task, 'retried', 1)
      retried, codes[#codes + 1] = true, 2
    elseif outcome == 'snooze' then
      settle_snoozed(key, delayed, id, f[4], started_at, due)
      retried, codes[#codes + 1] = true, 5
    elseif outcome == 'suspend' then
      local suspended = settle_suspended(K, id, f)
      codes[#codes + 1], retried = suspended and 6 or 7, true
      if suspended then suspended_event(events, events_maxlen, key, id, f, started_at, now_s) end
    elseif outcome == 'cancelled' or outcome == 'expired' then
      state, err = outcome, payload
      settle_cancelled(key, payload, started_at, now_s, retention, outcome, f[4])
      codes[#codes + 1] = outcome == 'cancelled' and 4 or 8
      if outcome == 'expired' then count(tally, task, 'expired', 1) end
    else
      state, err = 'dead', payload
      settle_dead(key, payload, started_at, now_s)
      for _, old in ipairs(bury(dead, job_prefix, id, now, dead_cap)) do
        trimmed[#trimmed + 1] = old
      end
      count(tally, task, 'failed', 1)
      count(tally, task, 'dead', 1)
      codes[#codes + 1] = 3
    end
    if f[16] then track_expiry(K.expiring, id, f[16], f[17], state) end
    if state ~= nil then
      free_dedupe_key(dedupe_prefix, f[6], id)
      if streaming(events) then
        local job = finished_job(f, not unstarted and started_at or nil, now_s)
        job.state, job.error = state, err
        emit_event(events, events_maxlen, id, job)
      end
      handed = handed + hand_over(job_prefix, id, now, f[14] ~= false or f[15] ~= false)
    end
  end
end
-- Per batch, not per job: leases, active and running counts, idle times and metrics.
end_runs({ leases = leases, active = K.active, idle = K.idle, flow = K }, done_leases,
  done_tasks, done_tenants, now_s)
write_tally(tally, bucket_key(K.metrics_prefix, now, bucket_seconds), bucket_ttl)
-- A retry may now be the earliest due job: idle workers must re-arm their timers.
if retried then wake_one(K.wake) end
return { codes, trimmed, handed }
