#!lua
--!df flags=allow-undeclared-keys
-- Send a signal to a job. A job that waits for it (its 'wt' names a signal of that name,
-- also in the moment between the run describing the wait and its finish) gets it recorded
-- as the wait's outcome, and resumes if it is suspended; any other job that has not ended
-- keeps it in its mailbox until a wait of that name consumes it. Each signal is consumed
-- at most once: a wait records one payload, and a signal sent again after a lost reply is
-- answered from the kept reply (the transport), not kept twice.
--
-- K.job_prefix
-- K.delayed
-- K.counts
-- K.ready_prefix
-- K.ring_prefix
-- K.priorities
-- K.wake
-- K.suspended
-- A.id         short id of the job
-- A.name       the signal's name (1-200 bytes)
-- A.payload    the encoded payload
-- Returns: 1 delivered (recorded as a wait's outcome), 2 kept in the mailbox, 0 refused:
--          no such job, or it has ended
--@include suspend

local id, name, payload = A.id, A.name, A.payload
if not id or id == '' or not name or name == '' or #name > 200 or not payload then
  return redis.error_reply('ERR signal: id and a name of 1-200 bytes must be set')
end

local wrong = resume_keys_problem('signal', K)
if wrong then return redis.error_reply(wrong) end
local key = K.job_prefix .. id
local f = redis.pcall('HMGET', key, 's', 'wt', 'p', 'tenant', 'sig:' .. name, 'w:' .. name)
local state = f[1]
if type(state) ~= 'string' or state == 'succeeded' or state == 'dead' or state == 'cancelled'
    or state == 'expired' then
  return 0
end
local w = parse_wait(f[2])
if w and w.kind == 'signal' and w.name == name and not f[6] then
  record_wait(K, id, w, 's' .. payload, { state = state, priority = f[3], tenant = f[4] })
  return 1
end
redis.call('HSET', key, 'sig:' .. name, mailbox_push(f[5], payload))
return 2
