-- Jobs that must start by a time, and jobs that must finish by one. A job enqueued with
-- `expires` or `deadline` carries 'x' (ms): the time it must start by (the earlier of the
-- two), and with a deadline 'dl' (ms) too. While it has not started, it is in the queue's
-- `expiring` set at 'x', the server-clock timer every fetch looks at (fetch's next due
-- time includes it, so an idle worker wakes for it): when 'x' passes, the job ends
-- 'expired' wherever it waits (ready, scheduled, waiting for a retry, suspended, a
-- workflow node waiting for its parents), and a lease never starts a job past its 'x'.
-- Leased with a deadline, its entry moves to 'dl': when that passes, its run is cancelled
-- as a running job is (its holder hears it with its next heartbeat), and the job ends
-- 'expired'. A job put back to wait again (a retry, a snooze, a suspension, a lost lease)
-- is put back at its 'x'.
--@include clock
--@include counter
--@include metrics
--@include finish
--@include suspend
--@include expiry_times

local DEFAULT_RETENTION = 86400  -- s, for a caller that passes none (an enqueue's hand-off)

-- Put a job that waits again back on the timer of the time it must start by.
local function rearm_expiry(expiring, id, x)
  if x then soft_call('ZADD', expiring, x, id) end
end

-- Where a job past its start-by time waited, it waits no more. f: the record's state and
-- 'wt', 'wfw' as expire_due reads them.
local function leave_waiting(k, id, state, f)
  if state == 'ready' then
    -- Still in its ready list: the fetch that meets it there drops it (and only then does
    -- its record start to expire, 'keep' holding the retention, as for a cancel).
    add_count(k.counts, 'ready', -1)
  elseif state == 'suspended' then
    redis.call('ZREM', k.delayed, id)
    count_suspended(k, id, parse_wait(f.wt), -1)
  else
    redis.call('ZREM', k.delayed, id)
    if f.wfw then redis.call('HDEL', k.job_prefix .. id, 'wfw') end
  end
end

-- End a job that did not start in time: state 'expired' with the reason, its dedupe key
-- freed, its event written, its workflow children told (through the hand-over, as for a
-- dead parent), counted, and named in out.expired (the worker runs the on_expire hooks).
local function end_expired(k, cfg, tally, now, id, f, listed, out)
  local key = k.job_prefix .. id
  local finished_at = seconds(now)
  local reason = 'expired: not started by ' .. seconds(tonumber(f.x) or now)
  local retention = cfg.retention or DEFAULT_RETENTION
  redis.call('HSET', key, 's', 'expired', 'error', reason, 'finished_at', finished_at)
  if listed then
    redis.call('HSET', key, 'keep', retention)
  else
    redis.call('EXPIRE', key, retention)
  end
  soft_call('ZREM', k.expiring, id)
  free_dedupe_key(k.dedupe_prefix, f.key, id)
  emit_event(k.events, cfg.events_maxlen, id, { task = f.task, state = 'expired',
    attempts = f.attempts or '0', enqueued_ms = f.e, run_at = f.run_at, finished_at =
    finished_at, tenant = f.tenant, error = reason, trace = f.tr })
  hand_over(k.job_prefix, id, now)
  count(tally, f.task or '', 'expired', 1)
  out.expired[#out.expired + 1] = id
end

local EXPIRY_FIELDS = { 's', 'x', 'dl', 'wt', 'wfw', 'key', 't', 'attempts', 'e', 'run_at',
  'tenant', 'tr', 'cancel' }

local function expiry_fields(key)
  local raw = redis.pcall('HMGET', key, unpack(EXPIRY_FIELDS))
  if raw.err then return nil end
  local f = {}
  for i, name in ipairs(EXPIRY_FIELDS) do f[name] = raw[i] or nil end
  f.task = f.t
  return f
end

-- A running job past its deadline: its run is cancelled as a running job is (its holder
-- hears it with its next heartbeat); the finish of a cancelled job past its deadline
-- records it 'expired' (final_outcome).
local function deadline_passed(k, id, key, f, cfg, now)
  if not f.cancel then
    redis.call('HSET', key, 'cancel', 'deadline passed at ' .. seconds(tonumber(f.dl)),
      'cancel_ttl', cfg.retention or DEFAULT_RETENTION)
    soft_call('ZADD', k.cancelling, now, id)
  end
  soft_call('ZREM', k.expiring, id)
end

-- The timer: every job whose start-by time (or, running, deadline) has passed. k: the
-- queue's keys (job_prefix, expiring, delayed, counts, suspended, cancelling, dedupe_prefix,
-- events); cfg: retention and events_maxlen.
-- Returns the earliest time left on the timer (ms), or nil: part of fetch's next due time.
local function expire_due(k, now, limit, cfg, tally, out)
  local head = redis.pcall('ZRANGE', k.expiring, 0, 0, 'WITHSCORES')
  if head.err or #head == 0 then return nil end  -- no timer (or one written over by hand)
  if tonumber(head[2]) > now then return tonumber(head[2]) end  -- nothing due: one read
  local due = redis.call('ZRANGE', k.expiring, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    local key = k.job_prefix .. id
    local f = expiry_fields(key)
    local state = f and f.s
    if state == 'active' then
      if f.dl and now >= tonumber(f.dl) then deadline_passed(k, id, key, f, cfg, now)
      else soft_call('ZREM', k.expiring, id) end  -- started in time: no deadline to keep
    elseif state == 'ready' or state == 'scheduled' or state == 'retrying'
        or state == 'suspended' then
      leave_waiting(k, id, state, f)
      end_expired(k, cfg, tally, now, id, f, state == 'ready', out)
    else
      soft_call('ZREM', k.expiring, id)  -- ended, or gone
    end
  end
  head = redis.call('ZRANGE', k.expiring, 0, 0, 'WITHSCORES')
  return head[2] and tonumber(head[2]) or nil
end
