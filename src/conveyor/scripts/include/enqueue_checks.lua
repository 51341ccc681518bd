--@include clock
--@include expiry_times
-- Checks of enqueue's ARGV (see enqueue.lua's header), made before its first write.

-- The first problem with the arguments, or nil.
local function enqueue_problem()
  local n_jobs = tonumber(A.jobs)
  if not n_jobs or #ARGV ~= ITEM.first - 1 + n_jobs * ITEM.fields then
    return 'expected ' .. tostring(n_jobs) .. ' jobs of ' .. ITEM.fields .. ' fields, got '
      .. (#ARGV - ITEM.first + 1) .. ' values'
  end
  if A.task == '' then return 'task must not be empty' end
  local priority = tonumber(A.priority)
  if not priority or priority ~= math.floor(priority) or priority < 0 or priority > 9 then
    return 'priority must be an integer 0-9, got ' .. A.priority
  end
  local max_attempts, visibility_ms = tonumber(A.max_attempts), tonumber(A.visibility_ms)
  if not max_attempts or max_attempts < 1 then return 'max_attempts must be >= 1' end
  if not visibility_ms or visibility_ms <= 0 then return 'visibility_ms must be > 0' end
  if (A.delay_ms ~= '' and not tonumber(A.delay_ms))
      or (A.at_ms ~= '' and not tonumber(A.at_ms)) then
    return 'delay_ms and at_ms must be numbers or empty'
  end
  local key = A.key
  if key ~= '' and n_jobs > 1 then return 'a dedupe key names one job, got ' .. n_jobs end
  if A.parent ~= '' and n_jobs ~= 1 then return 'a parent waits for one job, got ' .. n_jobs end
  for _, raw in ipairs({ A.expires, A.deadline }) do
    if not expiry_arg_ok(raw) then
      return "expires and deadline must be '+<ms>', '<ms>' or empty, got " .. raw
    end
  end
  for _, raw in ipairs({ A.debounce_ms, A.debounce_max_ms, A.throttle_ms }) do
    local v = tonumber(raw)
    if raw ~= '' and (not v or v <= 0) then
      return 'debounce_ms, debounce_max_ms and throttle_ms must be positive numbers or empty'
    end
  end
  if (A.debounce_ms ~= '' or A.throttle_ms ~= '') and key == '' then
    return 'debounce and throttle need a key'
  end
  for i = 0, n_jobs - 1 do
    if ARGV[ITEM.first + i * ITEM.fields + ITEM.short_id] == '' then
      return 'job ' .. i .. ' has no id'
    end
  end
  if not tonumber(A.dead_cap) or not tonumber(A.events_maxlen) then
    return 'dead_cap and events_maxlen must be numbers'
  end
  if A.claim ~= '' and not tonumber(A.claim_tick) then return 'claim_tick must be a number' end
  if A.trace ~= '' and not string.match(A.trace, '^' .. string.rep('%x', 32) .. '$') then
    return 'trace must be empty or 32 hex digits'
  end
  return nil
end

-- A child job (ctx.child) is planned by its parent under a fixed id and sent again until
-- stored: one whose record exists already is that same job, never stored over.
local function child_stored(job_prefix)
  return A.parent ~= '' and redis.call('EXISTS', job_prefix .. ARGV[ITEM.first + ITEM.short_id]) == 1
end

-- A periodic's claim of `tick` (ms) on its cursor key: false when this or a later tick was
-- claimed first (another worker fired it), or on the periodic's first start ('seen' and no
-- cursor yet), which only records the tick so that past ticks do not fire. Which tick last
-- fired is kept apart, by the caller, once the jobs are stored.
local function claim_fires(schedule_key, tick, mode)
  local last = tonumber(redis.call('GET', schedule_key))
  if last and last >= tick then return false end
  redis.call('SET', schedule_key, string.format('%d', tick))
  return last ~= nil or mode ~= 'seen'
end

-- The fields few jobs have, appended to `record` when they apply: debounce's latest run,
-- a periodic tick, the trace id, the waiting parent, the times to start and finish by
-- (include/expiry.lua). Returns the time the jobs must start by (ms), or nil.
local function rarer_fields(record, now, debounce_max_ms, claim_tick)
  local function put(name, value)
    record[#record + 1] = name
    record[#record + 1] = value
  end
  if debounce_max_ms then put('debounce_until', string.format('%.3f', now + debounce_max_ms)) end
  if A.claim ~= '' then put('tick', seconds(claim_tick)) end
  if A.trace ~= '' then put('tr', A.trace) end
  if A.parent ~= '' then put('pw', A.parent) end
  return put_expiry(put, now, A.expires, A.deadline)
end
