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

local function new_tally()
  return { counts = {}, sums = {} }
end

local function count(tally, task, what, by)
  local field = task .. '|' .. what
  tally.counts[field] = (tally.counts[field] or 0) + by
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
  count(tally, task, 'w|' .. histogram_bin(wait_s), 1)
  count(tally, task, 'r|' .. histogram_bin(run_s), 1)
  tally.sums[task .. '|wsum'] = (tally.sums[task .. '|wsum'] or 0) + wait_s
  tally.sums[task .. '|rsum'] = (tally.sums[task .. '|rsum'] or 0) + run_s
end

-- The bucket gets its lifetime from the call that creates one of its fields (the first
-- write to a bucket always does), so most calls skip the EXPIRE.
local function write_tally(tally, bucket, ttl)
  local created = false
  for field, by in pairs(tally.counts) do
    if tonumber(redis.call('ZINCRBY', bucket, by, field)) == by then created = true end
  end
  for field, by in pairs(tally.sums) do
    redis.call('ZINCRBY', bucket, string.format('%.6f', by), field)
  end
  if created then redis.call('EXPIRE', bucket, ttl) end
end
