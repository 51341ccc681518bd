#!lua
--!df flags=allow-undeclared-keys
-- Extend the leases of jobs a worker is still running. Only the holder of the current
-- token may extend; a lease that was reclaimed stays lost and its job runs elsewhere.
-- A job someone asked to cancel answers 2: the holder stops it and records the end.
-- A lease whose run has begun says so once (started '1'): the record keeps that lease's
-- token as 'rs', so that a fetch reclaiming the lease later charges its attempt, and
-- gives back the attempt of a lease whose run was never known to begin
-- (include/maintain.lua). Started '2': the run began under an earlier lease, whose
-- attempt was charged, and goes on under this one (its worker leased the job again while
-- it ran): this lease's attempt is given back, once.
--
-- K.job_prefix
-- K.leases
-- K.cancelling
-- A.now           '' for the server clock (ms override, tests only)
-- A.leases        number of leases that follow, 4 fields each: short id, token, extend_ms,
--                 started ('1': its run has begun; '2': it goes on from an earlier
--                 lease's, whose start was told; '' otherwise)
-- Returns: one code per lease: 1 extended, 0 lost (the token is no longer current),
--          2 extended, and the job is to be cancelled
--@include clock

local job_prefix, leases, cancelling = K.job_prefix, K.leases, K.cancelling
local n = tonumber(A.leases)
local FIRST, FIELDS = ITEM.first, ITEM.fields
if not n or #ARGV ~= FIRST - 1 + n * FIELDS then
  return redis.error_reply('ERR heartbeat: expected ' .. tostring(n) .. ' leases of '
    .. FIELDS .. ' fields')
end
for i = 0, n - 1 do
  if not tonumber(ARGV[FIRST + i * FIELDS + ITEM.extend_ms]) then
    return redis.error_reply('ERR heartbeat: extend_ms must be a number')
  end
end

local now = now_ms(A.now)
local codes = {}
for i = 0, n - 1 do
  local base = FIRST + i * FIELDS
  local id = ARGV[base + ITEM.short_id]
  -- A record that is no hash reads as an error, so as lost (its lease is left to expire).
  local f = redis.pcall('HMGET', job_prefix .. id, 's', 'token', 'cancel', 'rs')
  if f[1] == 'active' and f[2] == ARGV[base + ITEM.token] then
    redis.call('ZADD', leases, 'XX', now + tonumber(ARGV[base + ITEM.extend_ms]), id)
    local started = ARGV[base + ITEM.started]
    if (started == '1' or started == '2') and f[4] ~= f[2] then
      local key = job_prefix .. id
      redis.call('HSET', key, 'rs', f[2])
      if started == '2' then
        local charged = tonumber(redis.call('HGET', key, 'attempts')) or 1
        redis.call('HSET', key, 'attempts', math.max(0, charged - 1))
      end
    end
    if f[3] then
      redis.call('ZREM', cancelling, id)  -- delivered: holders need not beat sooner for it
      codes[#codes + 1] = 2
    else
      codes[#codes + 1] = 1
    end
  else
    codes[#codes + 1] = 0
  end
end
return codes
