#!lua
-- Record how far running jobs have got. Only the holder of the current lease may write,
-- and not once the job is being cancelled: a stale or cancelled run's progress is refused.
--
-- KEYS[1] job_prefix
-- ARGV[1] reports number of reports that follow, 4 fields each: short id, token,
--                 fraction (0-1), note ('' for none)
-- Returns: one code per report: 1 written, 0 refused

local job_prefix = KEYS[1]
local n = tonumber(ARGV[1])
if not n or #ARGV ~= 1 + n * 4 then
  return redis.error_reply('ERR progress: expected ' .. tostring(n) .. ' reports of 4 fields')
end
for i = 0, n - 1 do
  local fraction = tonumber(ARGV[2 + i * 4 + 2])
  if not fraction or fraction ~= fraction or fraction < 0 or fraction > 1 then
    return redis.error_reply('ERR progress: fraction must be a number from 0 to 1')
  end
end

local codes = {}
for i = 0, n - 1 do
  local base = 2 + i * 4
  local key = job_prefix .. ARGV[base]
  local f = redis.pcall('HMGET', key, 's', 'token', 'cancel')  -- no hash: refused
  if f[1] == 'active' and f[2] == ARGV[base + 1] and not f[3] then
    redis.call('HSET', key, 'progress', ARGV[base + 2], 'progress_note', ARGV[base + 3])
    codes[#codes + 1] = 1
  else
    codes[#codes + 1] = 0
  end
end
return codes
