#!lua
-- Hand leased jobs back (a stopping worker's): they return to the front of their lists and
-- the attempt they were charged is given back. A job whose run had started and was
-- interrupted by the shutdown is handed back the same way, with the interruption recorded
-- on its record (its `error` and an `interruptions` count): a shutdown never uses up an
-- attempt nor dead-letters a job.
--
-- KEYS[1] job_prefix
-- KEYS[2] ready_prefix
-- KEYS[3] ring_prefix
-- KEYS[4] priorities
-- KEYS[5] leases
-- KEYS[6] counts
-- KEYS[7] active
-- KEYS[8] wake
-- KEYS[9] running
-- KEYS[10] parked
-- KEYS[11] limits
-- ARGV[1] jobs    number of jobs that follow, 3 fields each: short id, token, reason
--                 ('' for a job that never started, else why its run was interrupted)
-- Returns: number of jobs handed back (stale tokens are skipped)
--@include ready
--@include finish
--@include flow
--@include key_types

local job_prefix, ready_prefix, ring_prefix, priorities = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local leases, counts, active, wake = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local flow_keys = { counts = counts, running = KEYS[9], parked = KEYS[10], limits = KEYS[11],
  ready_prefix = ready_prefix, ring_prefix = ring_prefix, priorities = priorities, wake = wake }
local n = tonumber(ARGV[1])
if not n or #ARGV ~= 1 + n * 3 then
  return redis.error_reply('ERR release: expected ' .. tostring(n) .. ' jobs of 3 fields')
end
local wrong = wrong_key_type('release', { priorities, 'zset', leases, 'zset', counts, 'hash',
  active, 'hash', flow_keys.running, 'hash', flow_keys.parked, 'zset', flow_keys.limits,
  'hash' })
if wrong then return redis.error_reply(wrong) end

local released, by_tenant = 0, {}
for i = 0, n - 1 do
  local id, token, reason = ARGV[2 + i * 3], ARGV[3 + i * 3], ARGV[4 + i * 3]
  local key = job_prefix .. id
  local f = redis.pcall('HMGET', key, 's', 'token', 't', 'attempts', 'p', 'tenant',
    'cancel')  -- no hash (written over): not handed back; its lease expiry dead-letters it
  -- A job being cancelled is not handed back: it ends cancelled when its lease expires.
  if f[1] == 'active' and f[2] == token and not f[7] then
    redis.call('HSET', key, 's', 'ready', 'token', '',
      'attempts', math.max(0, (tonumber(f[4]) or 1) - 1))
    if reason ~= '' then
      redis.call('HSET', key, 'error', reason)
      add_count(key, 'interruptions', 1)
    end
    redis.call('ZREM', leases, id)
    release_active(active, f[3] or '')
    push_ready(ready_prefix, ring_prefix, priorities, id, f[5] or '5', f[6] or '', true)
    released = released + 1
    by_tenant[f[6] or ''] = (by_tenant[f[6] or ''] or 0) + 1
  end
end
made_ready(counts, wake, released)
flow_ended(flow_keys, released, by_tenant)
return released
