#!lua
--!df flags=allow-undeclared-keys
-- Give dead jobs a new life: fresh attempts, back at the end of their ready lists.
-- A job enqueued with a dedupe key is unfinished again, so it takes its key back (an
-- enqueue with the key then returns it). When another job took the key while this one was
-- dead (an enqueue with the key returns that one), requeueing it would leave two unfinished
-- jobs with one key: it stays in the dead set as it is, and is not counted. So does a job
-- whose record cannot be requeued as it stands: no hash (written over by hand), a
-- priority that is no 0-9, a dedupe key that cannot be read.
--
-- K.job_prefix
-- K.ready_prefix
-- K.ring_prefix
-- K.priorities
-- K.dead
-- K.counts
-- K.wake
-- K.dedupe_prefix
-- A.limit         with no ids: requeue up to this many of the oldest dead jobs
-- then the short ids to requeue, 1 field each (those not in the dead set are skipped)
-- Returns: number of jobs requeued
--@include clock
--@include ready
--@include dedupe
--@include key_types

local job_prefix, dead, dedupe_prefix = K.job_prefix, K.dead, K.dedupe_prefix
local limit = tonumber(A.limit)
if not limit or limit < 1 then return redis.error_reply('ERR requeue_dead: limit must be >= 1') end
local wrong = wrong_key_type('requeue_dead', { K.priorities, 'zset', dead, 'zset', K.counts,
  'hash' })
if wrong then return redis.error_reply(wrong) end

-- Whether dead job `id`, its record's fields f (HMGET below), may be requeued: its priority
-- is one a ready list can have, and its dedupe key (if any) is free or its own. A key
-- that cannot be read (another type) is taken as held.
local function requeueable(f, id)
  if f[2] and not string.match(f[2], '^%d$') then return false end
  if not f[4] or f[4] == '' then return true end
  local ok, holder = pcall(key_holder, job_prefix, dedupe_prefix, f[4])
  return ok and (holder == nil or holder == id)
end

local ids = {}
if #ARGV >= ITEM.first then
  for i = ITEM.first, #ARGV, ITEM.fields do ids[#ids + 1] = ARGV[i + ITEM.short_id] end
else
  ids = redis.call('ZRANGE', dead, 0, limit - 1)
end
local now_s, requeued = seconds(now_ms('')), 0
for _, id in ipairs(ids) do
  local key = job_prefix .. id
  local f = false  -- the record's fields, for an id in the dead set
  if redis.call('ZSCORE', dead, id) then
    f = redis.pcall('HMGET', key, 's', 'p', 'tenant', 'key')
  end
  if f and not f.err and not f[1] then
    redis.call('ZREM', dead, id)  -- its record is gone: nothing left to requeue
  elseif f and not f.err and requeueable(f, id) then
    redis.call('ZREM', dead, id)
    redis.call('HSET', key, 's', 'ready', 'attempts', 0, 'token', '', 'run_at', now_s)
    redis.call('HDEL', key, 'started_at', 'finished_at')
    if f[4] and f[4] ~= '' then redis.call('SET', dedupe_prefix .. f[4], id) end
    push_ready(K.ready_prefix, K.ring_prefix, K.priorities, id, f[2] or '5', f[3] or '', false)
    requeued = requeued + 1
  end
end
made_ready(K.counts, K.wake, requeued)
return requeued
