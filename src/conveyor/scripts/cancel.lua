#!lua
-- Cancel a job that has not started: a scheduled or retrying job leaves the delayed set; a
-- ready job is marked and skipped by the next fetch that meets it (O(1), no list scan).
-- The record of a cancelled ready job gets its TTL only when that fetch removes it from
-- its list ('keep' holds the retention until then): were it to expire while still listed,
-- the fetch could not tell it from a ready job whose record was lost, and would take it
-- off the ready count a second time.
--
-- KEYS[1] job_prefix
-- KEYS[2] delayed
-- KEYS[3] counts
-- KEYS[4] dedupe_prefix
-- ARGV[1] now        '' for the server clock (ms override, tests only)
-- ARGV[2] retention  seconds the cancelled record is kept
-- ARGV[3] id         short id of the job
-- Returns: the state the job was in ('' when there is no such job); it was cancelled
--          only if that state was scheduled, retrying or ready
--@include clock
--@include finish

local job_prefix, delayed, counts, dedupe_prefix = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local retention, id = tonumber(ARGV[2]), ARGV[3]
if not retention or not id or id == '' then
  return redis.error_reply('ERR cancel: retention must be a number and id non-empty')
end

local key = job_prefix .. id
local f = redis.call('HMGET', key, 'state', 'key')
local state = f[1]
if not state then return '' end
if state == 'scheduled' or state == 'retrying' then
  redis.call('ZREM', delayed, id)
elseif state == 'ready' then
  redis.call('HINCRBY', counts, 'ready', -1)
else
  return state
end
local now = now_ms(ARGV[1])
redis.call('HSET', key, 'state', 'cancelled', 'finished_at', seconds(now))
if state == 'ready' then
  redis.call('HSET', key, 'keep', retention)
else
  redis.call('EXPIRE', key, retention)
end
free_dedupe_key(dedupe_prefix, f[2], id)
hand_over(job_prefix, id, now)
return state
