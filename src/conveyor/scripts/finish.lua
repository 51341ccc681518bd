#!lua
-- Record the outcome of a batch of attempts: success, failure (retry with a delay, or dead
-- when attempts are spent), dead at once (unknown task, corrupt payload), snoozed (the
-- attempt given back; dead past the cap) or cancelled. A job someone asked to cancel ends
-- cancelled whatever its run reports (a late result or retry is refused).
-- An outcome is accepted only with the fencing token of the job's current lease: a worker
-- whose lease expired and was taken over cannot record anything, so one success is kept.
--
-- KEYS[1]  job_prefix
-- KEYS[2]  leases
-- KEYS[3]  delayed
-- KEYS[4]  dead
-- KEYS[5]  active
-- KEYS[6]  idle
-- KEYS[7]  dedupe_prefix
-- KEYS[8]  events
-- KEYS[9]  metrics_prefix
-- KEYS[10] wake
-- KEYS[11] counts
-- KEYS[12] running
-- KEYS[13] parked
-- KEYS[14] limits
-- KEYS[15] ready_prefix
-- KEYS[16] ring_prefix
-- KEYS[17] priorities
-- ARGV[1] now             '' for the server clock (ms override, tests only)
-- ARGV[2] retention       seconds a finished job record (and its result) is kept
-- ARGV[3] dead_cap        most dead letters kept
-- ARGV[4] events_maxlen   approximate cap of the events stream
-- ARGV[5] bucket_seconds  width of a metric bucket
-- ARGV[6] bucket_ttl      lifetime of a metric bucket (s)
-- ARGV[7] snooze_cap      most snoozes of a job; one more makes it dead
-- ARGV[8] outcomes        number of outcomes that follow, 6 fields each:
--         short id, token, outcome ('ok' | 'retry' | 'dead' | 'snooze' | 'cancelled'),
--         started_at (epoch s), payload (encoded result for 'ok', error text otherwise),
--         retry_delay_ms (the delay of a retry or a snooze)
-- Returns: { codes: one per outcome, 0 refused (stale token), 1 succeeded, 2 retrying,
--            3 dead, 4 cancelled, 5 snoozed; short ids trimmed from the dead letters by
--            the cap; how many of the jobs that ended were workflow nodes queued for
--            hand-over }
--@include clock
--@include metrics
--@include finish
--@include ready
--@include settle
--@include flow
--@include key_types

local job_prefix, leases, delayed, dead, active = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local idle, dedupe_prefix, events, metrics_prefix, wake = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local flow_keys = { counts = KEYS[11], running = KEYS[12], parked = KEYS[13], limits = KEYS[14],
  ready_prefix = KEYS[15], ring_prefix = KEYS[16], priorities = KEYS[17], wake = wake }
local retention, dead_cap, events_maxlen = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local bucket_seconds, bucket_ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
local snooze_cap, n = tonumber(ARGV[7]), tonumber(ARGV[8])
local FIELDS, FIRST = 6, 9
if not (retention and dead_cap and events_maxlen and bucket_seconds and bucket_ttl and n
    and snooze_cap) or #ARGV ~= FIRST - 1 + n * FIELDS then
  return redis.error_reply('ERR finish: expected numeric settings and ' .. tostring(n)
    .. ' outcomes of ' .. FIELDS .. ' fields')
end
local unknown = unknown_outcome(ARGV, FIRST, FIELDS, n)
if unknown then return redis.error_reply('ERR finish: unknown outcome ' .. unknown) end
local wrong = wrong_key_type('finish', { leases, 'zset', delayed, 'zset', dead, 'zset',
  active, 'hash', idle, 'hash', events, 'stream', flow_keys.counts, 'hash',
  flow_keys.running, 'hash', flow_keys.parked, 'zset', flow_keys.limits, 'hash',
  flow_keys.priorities, 'zset', handover_key(job_prefix), 'list' })
if wrong then return redis.error_reply(wrong) end

local now = now_ms(ARGV[1])
local now_s = seconds(now)
local codes, trimmed, retried, handed = {}, {}, false, 0
local tally, done_leases, done_tasks, done_tenants = new_tally(), {}, {}, {}
for i = 0, n - 1 do
  local base = FIRST + i * FIELDS
  local id, token, outcome = ARGV[base], ARGV[base + 1], ARGV[base + 2]
  local started_at, payload = ARGV[base + 3], ARGV[base + 4]
  local key = job_prefix .. id
  -- A record that is no hash (written over by hand) reads as an error: refused, like a
  -- stale token; its lease expires and the fetch that reclaims it dead-letters it.
  local f = redis.pcall('HMGET', key, 's', 'token', 't', 'attempts', 'm', 'key', 'e',
    'run_at', 'tenant', 'p', 'cancel', 'snoozes', 'tr', 'wf')
  if f[1] ~= 'active' or f[2] ~= token then
    codes[#codes + 1] = 0
  else
    -- The event's fields are gathered only for a queue that streams (see emit_event).
    local task, state, err = f[3] or '', nil, nil
    done_leases[#done_leases + 1] = id
    done_tasks[task] = (done_tasks[task] or 0) + 1
    done_tenants[f[9] or ''] = (done_tenants[f[9] or ''] or 0) + 1
    outcome, payload = final_outcome(outcome, payload, f, snooze_cap)
    if outcome ~= 'snooze' then
      local enqueued_at, run_at = (tonumber(f[7]) or 0) / 1000, tonumber(f[8]) or 0
      local waited = (tonumber(started_at) or 0) - math.max(enqueued_at, run_at)
      observe(tally, task, waited, now / 1000 - (tonumber(started_at) or now / 1000))
    end
    local due = now + (tonumber(ARGV[base + 5]) or 0)
    if outcome == 'ok' then
      state = 'succeeded'
      settle_succeeded(key, payload, started_at, now_s, retention)
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
    elseif outcome == 'cancelled' then
      state, err = 'cancelled', payload
      settle_cancelled(key, payload, started_at, now_s, retention)
      codes[#codes + 1] = 4
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
    if state ~= nil then
      free_dedupe_key(dedupe_prefix, f[6], id)
      if streaming(events) then
        local job = finished_job(f, started_at, now_s)
        job.state, job.error = state, err
        emit_event(events, events_maxlen, id, job)
      end
      handed = handed + hand_over(job_prefix, id, now, f[14] ~= false)
    end
  end
end
-- Per batch, not per job: leases, active and running counts, idle times and metrics.
end_runs({ leases = leases, active = active, idle = idle, flow = flow_keys }, done_leases,
  done_tasks, done_tenants, now_s)
write_tally(tally, bucket_key(metrics_prefix, now, bucket_seconds), bucket_ttl)
-- A retry may now be the earliest due job: idle workers must re-arm their timers.
if retried then wake_one(wake) end
return { codes, trimmed, handed }
