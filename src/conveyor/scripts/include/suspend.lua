-- Durable waits. A run that reaches a sleep, a wait for a signal or a child job that is not
-- over yet writes what it waits for in the record's 'wt' field (wait.lua), and its finish
-- suspends the job: state 'suspended', no lease, the attempt given back. 'wt' is
-- "<kind> <until ms or -> <child id or -> <name>" (the name last: it may hold spaces), kind
-- 't' (time), 's' (signal) or 'c' (child): a suspended job may wait for days, so its record
-- keeps only what it needs, in few bytes. A wait that has an end in time (a sleep, a timeout) is in
-- the delayed set at that time, so the fetch that promotes due jobs wakes it with no timer
-- of its own.
--
-- The wait's outcome is recorded once, in the field 'w:' .. name, by whichever comes first:
-- the run that finds the time passed or a signal in the mailbox (wait.lua), the signal
-- (signal.lua) or the child's end (resume.lua). Recording clears 'wt', and a record that is
-- suspended then becomes ready; a later run of the task reads the recorded outcome instead
-- of waiting again. A signal no wait has consumed is kept in the mailbox field
-- 'sig:' .. name (cmsgpack list of payloads, oldest first).
--@include counter
--@include ready
--@include key_types

-- The fixed keys a resume writes (delayed, suspended, counts, priorities), checked before
-- the first write: a script that stopped half way on one written over by hand would leave
-- a wait recorded and its job suspended for good. The caller tries again later.
local function resume_keys_problem(script, k)
  local checks = { k.delayed, 'zset', k.suspended, 'set', k.counts, 'hash' }
  if k.priorities then checks[#checks + 1], checks[#checks + 2] = k.priorities, 'zset' end
  return wrong_key_type(script, checks)
end

local WAIT_KINDS = { time = 't', signal = 's', child = 'c' }
local KIND_NAMES = { t = 'time', s = 'signal', c = 'child' }

-- The parts of a 'wt' field: kind ('time', 'signal', 'child'), until (ms, or nil), child
-- id (or nil), name; nil for a field that is absent or does not parse.
local function parse_wait(wt)
  if not wt then return nil end
  local letter, until_ms, child, name = string.match(wt, '^(%a) (%S+) (%S+) (.+)$')
  local kind = KIND_NAMES[letter or '']
  if not kind then return nil end
  return { kind = kind, until_ms = tonumber(until_ms), child = child ~= '-' and child or nil,
    name = name }
end

local function wait_field(kind, until_ms, child, name)
  local at = until_ms and string.format('%d', until_ms) or '-'
  return WAIT_KINDS[kind] .. ' ' .. at .. ' ' .. (child or '-') .. ' ' .. name
end

-- Suspended jobs are in the queue's 'suspended' set (a page of them is listed from it: a
-- set, not a sorted set, costs a suspended job half the bytes) and counted, those with a
-- timer in the delayed set apart (so that the delayed jobs are that set's size less
-- those): a backlog reads both counts with the ready count, in one command. k: counts and
-- suspended keys; w: the wait, as parse_wait reads it; by: 1 when it is suspended, -1 when
-- it no longer is.
local function count_suspended(k, id, w, by)
  if by > 0 then redis.pcall('SADD', k.suspended, id)  -- an index: see soft_call
  else redis.pcall('SREM', k.suspended, id) end
  add_count(k.counts, 'suspended', by)
  if w and w.until_ms then add_count(k.counts, 'suspended_timed', by) end
end

-- A suspended job whose wait is over: it leaves the delayed set (its timer) and joins the
-- front of its ready list, as a due delayed job does. k: job_prefix, delayed, counts,
-- ready_prefix, ring_prefix, priorities, wake, suspended.
local function resume_suspended(k, id, w, priority, tenant)
  redis.call('ZREM', k.delayed, id)
  redis.call('HSET', k.job_prefix .. id, 's', 'ready')
  push_ready(k.ready_prefix, k.ring_prefix, k.priorities, id, priority or '5', tenant or '',
    true)
  count_suspended(k, id, w, -1)
  add_count(k.counts, 'ready', 1)
  wake_one(k.wake)
end

-- Record the outcome of wait w, which the record names in 'wt', and resume the job if it
-- is suspended. f: the record's state, priority and tenant.
local function record_wait(k, id, w, value, f)
  redis.call('HSET', k.job_prefix .. id, 'w:' .. w.name, value)
  redis.call('HDEL', k.job_prefix .. id, 'wt')
  if f.state == 'suspended' then resume_suspended(k, id, w, f.priority, f.tenant) end
end

-- The oldest payload kept in a mailbox field (nil when empty), and what the field holds
-- without it (nil when that was the last).
local function mailbox_pop(raw)
  if not raw then return nil, nil end
  local ok, list = pcall(cmsgpack.unpack, raw)
  if not ok or type(list) ~= 'table' or #list == 0 then return nil, nil end
  local first = table.remove(list, 1)
  if #list == 0 then return tostring(first), nil end
  return tostring(first), cmsgpack.pack(list)
end

local function mailbox_push(raw, payload)
  local list = {}
  if raw then
    local ok, old = pcall(cmsgpack.unpack, raw)
    if ok and type(old) == 'table' then list = old end
  end
  list[#list + 1] = payload
  return cmsgpack.pack(list)
end
