-- The ends of a run that `finish` records, one function per outcome. Each writes the job
-- record only; the caller releases the lease and the active slot for the whole batch.
--@include job_record
--@include clock
--@include finish
--@include flow
--@include suspend
--@include expiry

-- When a run began (epoch s, as the worker sent it; '0' for a run that never began): the
-- worker's reckoning of the server clock, which may run a little ahead of it. A run never
-- began after the finish that records its end.
local function run_began_at(raw, now, now_s)
  local at = tonumber(raw)
  if at and at ~= 0 and at * 1000 > now then return now_s end
  return raw
end

-- The fields of a job's event (see emit_event), from the record's fields f as finish reads
-- them (task f[3], attempts f[4], enqueued_at f[7], run_at f[8], tenant f[9], priority
-- f[10], trace id f[13]); the state (and error) are set once the outcome is known.
local function finished_job(f, started_at, now_s)
  return { task = f[3] or '', attempts = f[4] or '0', enqueued_ms = f[7],
    run_at = f[8],
    tenant = f[9], priority = f[10], trace = f[13], started_at = started_at,
    finished_at = now_s }
end

-- A run's wait (from when the job could run to its start) and run time, for the metrics.
-- f holds the record's fields as finish reads them (enqueued_at f[7], run_at f[8]).
local function observe_run(tally, task, f, started_at, now)
  local enqueued_at, run_at = (tonumber(f[7]) or 0) / 1000, tonumber(f[8]) or 0
  local waited = (tonumber(started_at) or 0) - math.max(enqueued_at, run_at)
  observe(tally, task, waited, now / 1000 - (tonumber(started_at) or now / 1000))
end

-- What a run's report becomes: a job being cancelled ends cancelled whatever its run says
-- (f[11] is the cancel reason); a retry with no attempt left, or a snooze past the cap, is
-- dead. f holds the record's fields as finish reads them (attempts f[4], max f[5], snoozes
-- f[12]).
local function final_outcome(outcome, payload, f, snooze_cap, now)
  -- Past its deadline (f[17], include/expiry.lua) the job is expired, whatever the run
  -- reports: whether the timer had asked to cancel it yet or not.
  local deadline = tonumber(f[17])
  if deadline and now >= deadline then
    return 'expired', f[11] or ('deadline passed at ' .. seconds(deadline))
  end
  if f[11] then return 'cancelled', f[11] end
  if outcome == 'retry' and (tonumber(f[4]) or 1) >= (tonumber(f[5]) or DEFAULT_MAX_ATTEMPTS) then
    return 'dead', payload
  end
  if outcome == 'snooze' and (tonumber(f[12]) or 0) >= snooze_cap then
    return 'dead', 'snoozed ' .. tostring(snooze_cap) .. ' times: the cap of snoozes is reached'
  end
  return outcome, payload
end

local function settle_succeeded(key, payload, started_at, now_s, retention, error)
  redis.call('HSET', key, 's', 'succeeded', 'token', '', 'result', payload,
    'started_at', started_at, 'finished_at', now_s)
  if error then redis.call('HDEL', key, 'error') end  -- an earlier attempt's (a retry...)
  redis.call('EXPIRE', key, retention)
end

local function settle_retrying(key, delayed, id, payload, started_at, now_s, due)
  redis.call('HSET', key, 's', 'retrying', 'token', '', 'error', payload,
    'started_at', started_at, 'finished_at', now_s, 'run_at', seconds(due))
  redis.call('ZADD', delayed, due, id)
end

-- Snoozed: back to scheduled, the attempt given back, the snooze counted.
local function settle_snoozed(key, delayed, id, attempts, started_at, due)
  redis.call('HSET', key, 's', 'scheduled', 'token', '', 'started_at', started_at,
    'run_at', seconds(due), 'attempts', math.max(0, (tonumber(attempts) or 1) - 1))
  add_count(key, 'snoozes', 1)
  redis.call('ZADD', delayed, due, id)
end

-- Suspended at a durable wait (include/suspend.lua): no lease, the attempt given back, the
-- suspension counted. A wait whose outcome was recorded since the run described it (a
-- signal, the child's end) is not waited for: the job is ready at once. k holds finish's
-- keys.
local function settle_suspended(k, id, f)
  local key = k.job_prefix .. id
  -- What a suspended job does not need goes: its last run's start, its lease's token and
  -- holder, and attempts when back at none (readers take it absent as 0): a suspended job
  -- may wait for days.
  local attempts = math.max(0, (tonumber(f[4]) or 1) - 1)
  redis.call('HDEL', key, 'token', 'w', 'started_at')
  if attempts > 0 then redis.call('HSET', key, 'attempts', attempts)
  else redis.call('HDEL', key, 'attempts') end
  add_count(key, 'suspends', 1)
  local w = parse_wait(redis.call('HGET', key, 'wt'))
  if not w then
    redis.call('HSET', key, 's', 'ready')
    push_ready(k.ready_prefix, k.ring_prefix, k.priorities, id, f[10] or '5', f[9] or '', true)
    add_count(k.counts, 'ready', 1)
    return false
  end
  redis.call('HSET', key, 's', 'suspended')
  count_suspended(k, id, w, 1)
  if w.until_ms then redis.call('ZADD', k.delayed, w.until_ms, id) end
  return true
end

-- The event of a run that ended suspended, for a queue that streams: the sink keeps each
-- run's end, and this one's error says what the job waits for.
local function suspended_event(events, events_maxlen, key, id, f, started_at, now_s)
  if not streaming(events) then return end
  local job = finished_job(f, started_at, now_s)
  job.state, job.error = 'suspended', 'waits: ' .. tostring(redis.call('HGET', key, 'wt'))
  emit_event(events, events_maxlen, id, job)
end

-- A job with a time to start or finish by (include/expiry.lua) that is to wait again
-- (state nil: a retry, a snooze, a suspension) is back on the timer at its start-by time;
-- one that ended is off it. Only a job with a deadline is on the timer while it runs (the
-- lease took the others off): the others need no removal (a stray entry, were one left,
-- goes when the timer meets it).
local function track_expiry(expiring, id, start_by, deadline, state)
  if state == nil then rearm_expiry(expiring, id, start_by)
  elseif deadline then soft_call('ZREM', expiring, id) end
end

-- Cancelled (or expired past its deadline). A run that never began (started_at 0: the
-- cancel came while the job waited for a slot on its worker) gives its attempt back.
local function settle_cancelled(key, reason, started_at, now_s, retention, state, attempts)
  redis.call('HSET', key, 's', state or 'cancelled', 'token', '', 'error', reason,
    'finished_at', now_s)
  if tonumber(started_at) == 0 then
    redis.call('HDEL', key, 'started_at')
    redis.call('HSET', key, 'attempts', math.max(0, (tonumber(attempts) or 1) - 1))
  else
    redis.call('HSET', key, 'started_at', started_at)
  end
  redis.call('EXPIRE', key, retention)
end

local function settle_dead(key, payload, started_at, now_s)
  redis.call('HSET', key, 's', 'dead', 'token', '', 'error', payload,
    'started_at', started_at, 'finished_at', now_s)
end

-- The first outcome of a finish call's ARGV that is no known kind, or nil.
local FINISH_OUTCOMES = { ok = 1, retry = 1, dead = 1, snooze = 1, cancelled = 1,
  suspend = 1 }
local function unknown_outcome(n)
  for i = 0, n - 1 do
    local outcome = ARGV[ITEM.first + i * ITEM.fields + ITEM.outcome]
    if not FINISH_OUTCOMES[outcome] then return tostring(outcome) end
  end
  return nil
end

-- What the runs that a finish call ended give back, once per batch: their leases, the
-- active count of each task, the running counts of flow control; and the tasks' idle time.
local function end_runs(k, done_leases, done_tasks, done_tenants, now_s)
  for i = 1, #done_leases, 500 do
    redis.call('ZREM', k.leases, unpack(done_leases, i, math.min(i + 499, #done_leases)))
  end
  for task, finished in pairs(done_tasks) do
    release_active(k.active, task, finished)
    redis.call('HSET', k.idle, task, now_s)
  end
  flow_ended(k.flow, #done_leases, done_tenants)
end

