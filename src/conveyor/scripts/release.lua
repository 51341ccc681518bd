#!lua
--!df flags=allow-undeclared-keys
-- Hand leased jobs back (a stopping worker's): they return to the front of their lists and
-- the attempt they were charged is given back. A job whose run had started and was
-- interrupted by the shutdown is handed back the same way, with the interruption recorded
-- on its record (its `error` and an `interruptions` count): a shutdown never uses up an
-- attempt nor dead-letters a job. A job with a time to start by (include/expiry.lua) is
-- back on that timer, as any job put back to wait is, so that it ends 'expired' when the
-- time passes instead of waiting, counted ready, until a fetch happens to meet it.
--
-- K.job_prefix
-- K.ready_prefix
-- K.ring_prefix
-- K.priorities
-- K.leases
-- K.counts
-- K.active
-- K.wake
-- K.running
-- K.parked
-- K.limits
-- K.expiring
-- A.jobs          number of jobs that follow, 3 fields each: short id, token, reason
--                 ('' for a job that never started, else why its run was interrupted)
-- Returns: number of jobs handed back (stale tokens are skipped)
--@include ready
--@include finish
--@include flow
--@include key_types
--@include expiry_times

local job_prefix, leases, active = K.job_prefix, K.leases, K.active
local n = tonumber(A.jobs)
local FIRST, FIELDS = ITEM.first, ITEM.fields
if not n or #ARGV ~= FIRST - 1 + n * FIELDS then
  return redis.error_reply('ERR release: expected ' .. tostring(n) .. ' jobs of ' .. FIELDS
    .. ' fields')
end
local wrong = wrong_key_type('release', { K.priorities, 'zset', leases, 'zset', K.counts,
  'hash', active, 'hash', K.running, 'hash', K.parked, 'zset', K.limits, 'hash' })
if wrong then return redis.error_reply(wrong) end

local released, by_tenant = 0, {}
for i = 0, n - 1 do
  local base = FIRST + i * FIELDS
  local id, token = ARGV[base + ITEM.short_id], ARGV[base + ITEM.token]
  local reason = ARGV[base + ITEM.reason]
  local key = job_prefix .. id
  local f = redis.pcall('HMGET', key, 's', 'token', 't', 'attempts', 'p', 'tenant',
    'cancel', 'x')  -- no hash (written over): not handed back; its lease expiry dead-letters it
  -- A job being cancelled is not handed back: it ends cancelled when its lease expires.
  if f[1] == 'active' and f[2] == token and not f[7] then
    redis.call('HSET', key, 's', 'ready', 'token', '',
      'attempts', math.max(0, (tonumber(f[4]) or 1) - 1))
    if reason ~= '' then
      redis.call('HSET', key, 'error', reason)
      add_count(key, 'interruptions', 1)
    else  -- the lease set started_at (include/lease.lua) for a run that never began
      redis.call('HDEL', key, 'started_at')
    end
    redis.call('ZREM', leases, id)
    release_active(active, f[3] or '')
    push_ready(K.ready_prefix, K.ring_prefix, K.priorities, id, f[5] or '5', f[6] or '', true)
    if f[8] then soft_call('ZADD', K.expiring, f[8], id) end
    released = released + 1
    by_tenant[f[6] or ''] = (by_tenant[f[6] or ''] or 0) + 1
  end
end
made_ready(K.counts, K.wake, released)
flow_ended(K, released, by_tenant)
return released
