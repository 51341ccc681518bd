#!lua
--!df flags=allow-undeclared-keys
-- Cancel a job. One that has not started ends at once: a scheduled or retrying job (or
-- one suspended at a durable wait) leaves the delayed set; a ready job is marked and
-- skipped by the next fetch that meets it (O(1), no list scan). A running job is only marked: its holder learns of the cancel with its
-- next heartbeat (the `cancelling` set tells holders to beat sooner) and records the end;
-- if the holder is dead, the job ends cancelled when its lease expires, and is not re-run.
-- The record of a cancelled ready job gets its TTL only when that fetch removes it from
-- its list ('keep' holds the retention until then): were it to expire while still listed,
-- the fetch could not tell it from a ready job whose record was lost, and would take it
-- off the ready count a second time.
--
-- K.job_prefix
-- K.delayed
-- K.counts
-- K.dedupe_prefix
-- K.cancelling
-- K.suspended
-- A.now              '' for the server clock (ms override, tests only)
-- A.retention        seconds the cancelled record is kept
-- A.id               short id of the job
-- A.reason           who cancelled it and why (stored as the job's error)
-- Returns: the state the job was in ('' when there is no such job); it was cancelled
--          (or, when 'active', marked for cancelling) only if that state was scheduled,
--          retrying, suspended, ready or active
--@include clock
--@include counter
--@include finish
--@include suspend

local job_prefix = K.job_prefix
local retention, id, reason = tonumber(A.retention), A.id, A.reason
if not retention or not id or id == '' or not reason then
  return redis.error_reply('ERR cancel: retention must be a number and id non-empty')
end
if reason == '' then reason = 'cancelled' end

local key = job_prefix .. id
local f = redis.pcall('HMGET', key, 's', 'key')  -- a key that holds no hash: no job record
local state = f[1]
if not state then return '' end
local now = now_ms(A.now)
if state == 'active' then
  if redis.call('HSETNX', key, 'cancel', reason) == 1 then
    redis.call('HSET', key, 'cancel_ttl', retention)
    redis.call('ZADD', K.cancelling, now, id)
    -- Requests whose holder never answered (it died; the lease expiry settled the job).
    redis.call('ZREMRANGEBYSCORE', K.cancelling, '-inf', now - 3600000)
  end
  return state
elseif state == 'scheduled' or state == 'retrying' then
  redis.call('ZREM', K.delayed, id)
elseif state == 'suspended' then
  local wrong = resume_keys_problem('cancel', K)  -- before the first write
  if wrong then return redis.error_reply(wrong) end
  redis.call('ZREM', K.delayed, id)  -- the timer of its wait, if it has one
  count_suspended(K, id, parse_wait(redis.call('HGET', key, 'wt')), -1)
elseif state == 'ready' then
  add_count(K.counts, 'ready', -1)
else
  return state
end
redis.call('HSET', key, 's', 'cancelled', 'finished_at', seconds(now), 'error', reason)
if state == 'ready' then
  redis.call('HSET', key, 'keep', retention)
else
  redis.call('EXPIRE', key, retention)
end
free_dedupe_key(K.dedupe_prefix, f[2], id)
hand_over(job_prefix, id, now)
return state
