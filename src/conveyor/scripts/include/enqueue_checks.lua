-- Checks of enqueue's ARGV (see enqueue.lua's header), made before its first write.

-- The first problem with the arguments, or nil; FIRST is the index of the first job's id.
local function enqueue_problem(FIRST)
  local n_jobs = tonumber(ARGV[FIRST - 1])
  if not n_jobs or #ARGV ~= FIRST - 1 + n_jobs * 2 then
    return 'expected ' .. tostring(n_jobs) .. ' jobs of 2 fields, got ' .. (#ARGV - FIRST + 1)
      .. ' values'
  end
  if ARGV[7] == '' then return 'task must not be empty' end
  local priority = tonumber(ARGV[8])
  if not priority or priority ~= math.floor(priority) or priority < 0 or priority > 9 then
    return 'priority must be an integer 0-9, got ' .. ARGV[8]
  end
  local max_attempts, visibility_ms = tonumber(ARGV[12]), tonumber(ARGV[14])
  if not max_attempts or max_attempts < 1 then return 'max_attempts must be >= 1' end
  if not visibility_ms or visibility_ms <= 0 then return 'visibility_ms must be > 0' end
  if (ARGV[10] ~= '' and not tonumber(ARGV[10])) or (ARGV[11] ~= '' and not tonumber(ARGV[11])) then
    return 'delay_ms and at_ms must be numbers or empty'
  end
  local key = ARGV[13]
  if key ~= '' and n_jobs > 1 then return 'a dedupe key names one job, got ' .. n_jobs end
  for i = 15, 17 do
    local v = tonumber(ARGV[i])
    if ARGV[i] ~= '' and (not v or v <= 0) then
      return 'debounce_ms, debounce_max_ms and throttle_ms must be positive numbers or empty'
    end
  end
  if (ARGV[15] ~= '' or ARGV[17] ~= '') and key == '' then
    return 'debounce and throttle need a key'
  end
  for i = 0, n_jobs - 1 do
    if ARGV[FIRST + i * 2] == '' then return 'job ' .. i .. ' has no id' end
  end
  if not tonumber(ARGV[19]) or not tonumber(ARGV[20]) then
    return 'dead_cap and events_maxlen must be numbers'
  end
  if ARGV[4] ~= '' and not tonumber(ARGV[5]) then return 'claim_tick must be a number' end
  if ARGV[18] ~= '' and not string.match(ARGV[18], '^' .. string.rep('%x', 32) .. '$') then
    return 'trace must be empty or 32 hex digits'
  end
  return nil
end
