-- What every terminal transition shares: release the lease and the active slot, record
-- when the type last finished, free the dedupe key, and stream the record to the sink.
--@include job_record
--@include counter

-- Returns true when the count would have gone below zero (it is kept at 0): the record's
-- task is not the one counted when the job was leased (a record changed by hand).
local function release_active(active, task, finished)
  if add_count(active, task, -(finished or 1)) < 0 then
    redis.call('HSET', active, task, 0)
    return true
  end
  return false
end

-- A dedupe key written over with another type names no job: it is left as it is.
local function free_dedupe_key(dedupe_prefix, key, short_id)
  if key and key ~= '' and redis.pcall('GET', dedupe_prefix .. key) == short_id then
    redis.call('DEL', dedupe_prefix .. key)
  end
end

-- A queue streams its finished jobs only once a sink has read it: the sink sets the key
-- `<events>:on` (conveyor.keys.QueueKeys.events_on formats the same name; a test keeps
-- the two in step). Without a sink, a finished job costs no stream entry. Looked up once
-- per script call.
local streaming_known = {}
local function streaming(events)
  local on = streaming_known[events]
  if on == nil then
    on = redis.call('EXISTS', events .. ':on') == 1
    streaming_known[events] = on
  end
  return on
end

-- Fields that would be empty (no tenant, default priority, no error, no trace) are left out.
-- `job.enqueued_ms` is the record's 'e' field as read: turned into seconds only here, since
-- most queues stream nothing and a finish or a lease should not format it per job.
local function emit_event(events, maxlen, short_id, job)
  if not streaming(events) then return end
  local enqueued_at = ms_as_seconds(job.enqueued_ms)
  local fields = { 'XADD', events, 'MAXLEN', '~', maxlen, '*',
    'id', short_id, 'task', job.task, 'state', job.state, 'attempts', job.attempts,
    'enqueued_at', enqueued_at or '', 'run_at', job.run_at or enqueued_at or '',
    'started_at', job.started_at or '', 'finished_at', job.finished_at or '' }
  if job.tenant and job.tenant ~= '' then
    fields[#fields + 1] = 'tenant'
    fields[#fields + 1] = job.tenant
  end
  if job.priority and job.priority ~= '5' then
    fields[#fields + 1] = 'priority'
    fields[#fields + 1] = job.priority
  end
  if job.error and job.error ~= '' then
    fields[#fields + 1] = 'error'
    fields[#fields + 1] = job.error
  end
  if job.trace and job.trace ~= '' then
    fields[#fields + 1] = 'trace'
    fields[#fields + 1] = job.trace
  end
  redis.call(unpack(fields))
end

-- Move a job to the dead-letter set, trimming the oldest past the cap.
-- Returns the short ids trimmed away (their records are deleted).
local function bury(dead, job_prefix, short_id, now, cap)
  redis.call('ZADD', dead, now, short_id)
  redis.call('PERSIST', job_prefix .. short_id)
  local excess = redis.call('ZCARD', dead) - cap
  if excess <= 0 then return {} end
  local trimmed = redis.call('ZRANGE', dead, 0, excess - 1)
  for _, old in ipairs(trimmed) do redis.call('DEL', job_prefix .. old) end
  redis.call('ZREMRANGEBYRANK', dead, 0, excess - 1)
  return trimmed
end

-- The workflow hand-over outbox of the queue whose records live under job_prefix: the same
-- hash tag, so the same slot (conveyor.keys.QueueKeys.handover formats the same name; a
-- test keeps the two in step). Derived here so that every script that ends a job can
-- hand it over without one more KEYS entry.
local function handover_key(job_prefix)
  return string.match(job_prefix, '^{[^}]*}') .. ':wf:handover'
end

-- A workflow node just ended (succeeded, dead or cancelled) at `now` (ms): queue it for the
-- hand-over to its children, in the same script as the transition, so that no end is ever
-- missed. The entry is "<short id> <now>": a node that ends again (requeued from the dead
-- letters) gets an entry of its own, which a drainer removing the first cannot take away.
-- A child job a parent waits for (ctx.child: its record's 'pw' names the parent) is handed
-- over the same way, to its parent. Returns 1 if the job is either, else 0.
-- `workflow`, when given, says whether the record has 'wf' or 'pw', as the caller already
-- read it; otherwise it is looked up.
local function hand_over(job_prefix, short_id, now, workflow)
  if workflow == nil then
    local f = redis.call('HMGET', job_prefix .. short_id, 'wf', 'pw')
    workflow = f[1] ~= false or f[2] ~= false
  end
  if not workflow then return 0 end
  redis.call('RPUSH', handover_key(job_prefix), short_id .. ' ' .. string.format('%.3f', now))
  return 1
end
