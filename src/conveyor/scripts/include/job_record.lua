-- A job record keeps memory low: the fields every job has are one letter long (t task,
-- s state, a args, e enqueued at, in ms), and the options a job shares with most jobs
-- (p priority, m max attempts, v visibility timeout in ms) are stored only when they
-- differ from these defaults. conveyor/record.py holds the same names and defaults.
local DEFAULT_PRIORITY = '5'
local DEFAULT_MAX_ATTEMPTS = 4
local DEFAULT_VT = 30000

-- A stored ms time (the 'e' field) as the epoch seconds events carry; nil if unreadable.
local function ms_as_seconds(value)
  local ms = tonumber(value)
  if not ms then return nil end
  return string.format('%.3f', ms / 1000)
end
