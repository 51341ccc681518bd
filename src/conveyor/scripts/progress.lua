#!lua
--!df flags=allow-undeclared-keys
-- Record how far running jobs have got. Only the holder of the current lease may write,
-- and not once the job is being cancelled: a stale or cancelled run's progress is refused.
--
-- K.job_prefix
-- A.reports       number of reports that follow, 4 fields each: short id, token,
--                 fraction (0-1), note ('' for none)
-- Returns: one code per report: 1 written, 0 refused

local job_prefix = K.job_prefix
local n = tonumber(A.reports)
local FIRST, FIELDS = ITEM.first, ITEM.fields
if not n or #ARGV ~= FIRST - 1 + n * FIELDS then
  return redis.error_reply('ERR progress: expected ' .. tostring(n) .. ' reports of '
    .. FIELDS .. ' fields')
end
for i = 0, n - 1 do
  local fraction = tonumber(ARGV[FIRST + i * FIELDS + ITEM.fraction])
  if not fraction or fraction ~= fraction or fraction < 0 or fraction > 1 then
    return redis.error_reply('ERR progress: fraction must be a number from 0 to 1')
  end
end

local codes = {}
for i = 0, n - 1 do
  local base = FIRST + i * FIELDS
  local key = job_prefix .. ARGV[base + ITEM.short_id]
  local f = redis.pcall('HMGET', key, 's', 'token', 'cancel')  -- no hash: refused
  if f[1] == 'active' and f[2] == ARGV[base + ITEM.token] and not f[3] then
    redis.call('HSET', key, 'progress', ARGV[base + ITEM.fraction], 'progress_note',
      ARGV[base + ITEM.note])
    codes[#codes + 1] = 1
  else
    codes[#codes + 1] = 0
  end
end
return codes
