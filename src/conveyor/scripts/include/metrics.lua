-- Time-bucketed counters and log-scale histograms per task type. A bucket is a sorted
-- set `<metrics_prefix><bucket start s>` that expires, so memory does not grow with jobs;
-- each member's score is its value, so a reader sums a whole window of buckets in one
-- ZUNION. Members: '<task>|<counter>', '<task>|wsum' / '<task>|rsum' (seconds), and
-- '<task>|w|<bin>' / '<task>|r|<bin>' histograms of wait and run time.
-- A script tallies in a Lua table and writes each field once per call, so a batch of
-- outcomes costs a few commands, not a few per job.

local HISTOGRAM_GROWTH = 1.1  -- keep in step with conveyor.monitor.histogram.GROWTH
local LOG_GROWTH = math.log(HISTOGRAM_GROWTH)

local function bucket_key(metrics_prefix, ms, bucket_seconds)
  local start = math.floor(ms / 1000 / bucket_seconds) * bucket_seconds
  return metrics_prefix .. string.format('%d', start)
end

-- Bin 0 holds durations under 1 microsecond; bin i >= 1 holds [GROWTH^(i-1), GROWTH^i) us.
local function histogram_bin(duration_s)
  local us = duration_s * 1000000
  if us < 1 then return 0 end
  return math.floor(math.log(us) / LOG_GROWTH) + 1
end

-- A tally keeps, per task, its counters and the two histograms' bins as numbers; field
-- names are joined only when the tally is written (once per field per call), not per job.
local function new_tally()
  return { counts = {}, waits = {}, runs = {}, sums = {} }
end

local function of_task(t, task)
  local x = t[task]
  if not x then
    x = {}
    t[task] = x
  end
  return x
end

local function count(tally, task, what, by)
  local c = of_task(tally.counts, task)
  c[what] = (c[what] or 0) + by
end

-- A time computed from a record edited by hand can be NaN or infinite ('nan' and 'inf'
-- parse as numbers); such a sample is left out, since Redis refuses it in HINCRBYFLOAT.
local function finite(x)
  return x == x and x ~= math.huge and x ~= -math.huge
end

local function observe(tally, task, wait_s, run_s)
  if not (finite(wait_s) and finite(run_s)) then return end
  if wait_s < 0 then wait_s = 0 end
  if run_s < 0 then run_s = 0 end
  local w, r = of_task(tally.waits, task), of_task(tally.runs, task)
  local wb, rb = histogram_bin(wait_s), histogram_bin(run_s)
  w[wb] = (w[wb] or 0) + 1
  r[rb] = (r[rb] or 0) + 1
  local sums = of_task(tally.sums, task)
  sums.w = (sums.w or 0) + wait_s
  sums.r = (sums.r or 0) + run_s
end

-- The bucket gets its lifetime from the call that creates one of its fields (the first
-- write to a bucket always does), so most calls skip the EXPIRE.
-- Metrics are bookkeeping: a bucket key of the wrong type (written over by hand) is passed
-- over, never failing the call (a fetch or finish would be left half applied: leases
-- granted that no worker is told of, outcomes written that their worker sends again).
local function write_tally(tally, bucket, ttl)
  local created = false
  local function add(field, by)
    if tonumber(redis.pcall('ZINCRBY', bucket, by, field)) == by then created = true end
  end
  for task, c in pairs(tally.counts) do
    for what, by in pairs(c) do add(task .. '|' .. what, by) end
  end
  for task, bins in pairs(tally.waits) do
    for bin, by in pairs(bins) do add(task .. '|w|' .. bin, by) end
  end
  for task, bins in pairs(tally.runs) do
    for bin, by in pairs(bins) do add(task .. '|r|' .. bin, by) end
  end
  for task, sums in pairs(tally.sums) do
    redis.pcall('ZINCRBY', bucket, string.format('%.6f', sums.w), task .. '|wsum')
    redis.pcall('ZINCRBY', bucket, string.format('%.6f', sums.r), task .. '|rsum')
  end
  if created then redis.call('EXPIRE', bucket, ttl) end
end
