#!lua
-- Give dead jobs a new life: fresh attempts, back at the end of their ready lists.
--
-- KEYS[1] job_prefix
-- KEYS[2] ready_prefix
-- KEYS[3] ring_prefix
-- KEYS[4] priorities
-- KEYS[5] dead
-- KEYS[6] counts
-- KEYS[7] wake
-- ARGV[1] limit   with no ids: requeue up to this many of the oldest dead jobs
-- ARGV[2..] ids   short ids to requeue (those not in the dead set are skipped)
-- Returns: number of jobs requeued
--@include clock
--@include ready

local job_prefix, ready_prefix, ring_prefix, priorities = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local dead, counts, wake = KEYS[5], KEYS[6], KEYS[7]
local limit = tonumber(ARGV[1])
if not limit or limit < 1 then return redis.error_reply('ERR requeue_dead: limit must be >= 1') end

local ids = {}
if #ARGV > 1 then
  for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('ZRANGE', dead, 0, limit - 1)
end
local now_s, requeued = seconds(now_ms('')), 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', dead, id) == 1 then
    local key = job_prefix .. id
    local f = redis.call('HMGET', key, 's', 'p', 'tenant')
    if f[1] then
      redis.call('HSET', key, 's', 'ready', 'attempts', 0, 'token', '', 'run_at', now_s)
      redis.call('HDEL', key, 'started_at', 'finished_at')
      push_ready(ready_prefix, ring_prefix, priorities, id, f[2] or '5', f[3] or '', false)
      requeued = requeued + 1
    end
  end
end
made_ready(counts, wake, requeued)
return requeued
