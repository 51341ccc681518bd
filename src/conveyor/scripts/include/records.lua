-- Job records are untrusted: a hand edit, a bug elsewhere or a partial restore can leave a
-- field that is not what a script needs. A record that cannot be run as it stands is
-- dead-lettered with a reason naming the field, so one bad record never wedges a queue.
--@include job_record
--@include clock
--@include finish
--@include metrics
--@include key_types

local JOB_STATES = { scheduled = true, ready = true, active = true, succeeded = true,
  retrying = true, dead = true, cancelled = true, suspended = true, expired = true }

local function quoted(value)
  return "'" .. string.sub(tostring(value), 1, 40) .. "'"
end

-- Whether a field that must be a number, if present (not nil or false), is one: finite,
-- and with `positive` above 0.
local function number_or_absent(value, positive)
  if not value then return true end
  local x = tonumber(value)
  return x ~= nil and finite(x) and (not positive or x > 0)
end

-- Whether an optional priority is an integer 0-9.
local function priority_or_absent(value)
  if not value then return true end
  local p = tonumber(value)
  return p ~= nil and p == math.floor(p) and p >= 0 and p <= 9
end

-- Whether the fields a worker needs parse (priority, attempts, max attempts, visibility
-- timeout): the rules of record_problem, for a caller that has the bare values.
local function runnable_fields(priority, attempts, max_attempts, vt)
  return priority_or_absent(priority) and number_or_absent(attempts)
    and number_or_absent(max_attempts) and number_or_absent(vt, true)
end

-- The first problem found with the fields a worker needs, or nil. Absent fields are fine
-- (readers use defaults); present ones must parse. A record that is no hash has no fields.
local function record_problem(r)
  if r.wrong_type then
    return "corrupt record: the job's key holds a " .. r.wrong_type .. ', not a hash'
  end
  if r.state and not JOB_STATES[r.state] then
    return "corrupt record: field 'state' is not a job state: " .. quoted(r.state)
  end
  if not priority_or_absent(r.priority) then
    return "corrupt record: field 'priority' is not an integer 0-9: " .. quoted(r.priority)
  end
  if not number_or_absent(r.attempts) then
    return "corrupt record: field 'attempts' is not an integer: " .. quoted(r.attempts)
  end
  if not number_or_absent(r.max_attempts) then
    return "corrupt record: field 'max_attempts' is not an integer: " .. quoted(r.max_attempts)
  end
  if not number_or_absent(r.vt, true) then
    return "corrupt record: field 'vt' is not a positive number: " .. quoted(r.vt)
  end
  return nil
end

-- record_problem for a record found through a list or set: one that exists without a
-- state is a problem too; one that does not exist (expired, deleted) is none.
local function listed_record_problem(key, r)
  if r.state == nil and not r.wrong_type then
    if redis.call('EXISTS', key) == 1 then return "corrupt record: field 'state' is missing" end
    return nil
  end
  return record_problem(r)
end

-- Reads the fields record_problem checks (plus what a dead letter needs) as a table; with
-- `with_args`, the arguments too (for a lease: one read of the record in all). A key that
-- holds no hash reads as { wrong_type = its type, task = '' } (see key_types.lua).
local function read_record(key, with_args)
  local f
  if with_args then
    f = redis.pcall('HMGET', key, 's', 'p', 'attempts', 'm', 'v', 't', 'tenant', 'key', 'e',
      'run_at', 'started_at', 'cancel', 'cancel_ttl', 'tr', 'a')
  else
    f = redis.pcall('HMGET', key, 's', 'p', 'attempts', 'm', 'v', 't', 'tenant', 'key', 'e',
      'run_at', 'started_at', 'cancel', 'cancel_ttl', 'tr')
  end
  if f.err then return { wrong_type = redis.call('TYPE', key).ok, task = '' } end
  return { args = f[15] or nil, enqueued_ms = f[9] or nil,
    state = f[1] or nil, priority = f[2] or nil, attempts = f[3] or nil,
    max_attempts = f[4] or nil, vt = f[5] or nil, task = f[6] or '', tenant = f[7] or nil,
    key = f[8] or nil, run_at = f[10] or nil,
    started_at = f[11] or nil, cancel = f[12] or nil, cancel_ttl = f[13] or nil,
    trace = f[14] or nil }
end

-- For a record met through a list or set that does not hold jobs of its state (a ready
-- list, the delayed set): the reason to dead-letter it when nothing that does holds it
-- either, so that it would never run or end; nil when something does (a stray entry: the
-- job goes on where it is), or for a state the caller handles itself.
local TRACKED_IN = { active = 'leases', scheduled = 'delayed', retrying = 'delayed',
  dead = 'dead' }
local function stranded(k, id, r)
  local where = TRACKED_IN[r.state or '']
  if not where or redis.call('ZSCORE', k[where], id) then return nil end
  return "corrupt record: field 'state' is " .. quoted(r.state) .. ' but the job is not in'
    .. ' the ' .. where .. ' set'
end

-- Dead-letter a job (a bad record, or a lost lease on its last attempt): k holds the
-- queue's keys (job_prefix, dead, dedupe_prefix, events), out collects { dead = ids,
-- trimmed = ids }. A record that is no hash is set aside (key_types.lua), and the dead
-- letter is a record of its own holding the reason, which names where the value went.
local function dead_letter(k, cfg, tally, now, id, r, reason, out)
  local finished_at = seconds(now)
  if r.wrong_type then
    reason = reason .. ' (moved to ' .. set_aside(k.job_prefix .. id) .. ', kept for a week)'
  end
  redis.call('HSET', k.job_prefix .. id, 's', 'dead', 'token', '', 'error', reason,
    'finished_at', finished_at)
  for _, old in ipairs(bury(k.dead, k.job_prefix, id, now, cfg.dead_cap)) do
    out.trimmed[#out.trimmed + 1] = old
  end
  free_dedupe_key(k.dedupe_prefix, r.key, id)
  emit_event(k.events, cfg.events_maxlen, id, { task = r.task, state = 'dead',
    attempts = r.attempts or '0', enqueued_ms = r.enqueued_ms, run_at = r.run_at,
    started_at = r.started_at, finished_at = finished_at, tenant = r.tenant, error = reason,
    trace = r.trace })
  count(tally, r.task, 'dead', 1)
  hand_over(k.job_prefix, id, now)
  out.dead[#out.dead + 1] = id
end
