-- Time-bucketed counters and log-scale histograms per task type. A bucket is a hash
-- `<metrics_prefix><bucket start s>` that expires, so memory does not grow with jobs.
-- Fields: '<task>|<counter>' and '<task>|w|<bin>' / '<task>|r|<bin>' for wait and run time.

local HISTOGRAM_GROWTH = 1.1  -- keep in step with conveyor.monitor.histogram.GROWTH

local function bucket_key(metrics_prefix, ms, bucket_seconds)
  local start = math.floor(ms / 1000 / bucket_seconds) * bucket_seconds
  return metrics_prefix .. string.format('%d', start)
end

-- Bin 0 holds durations under 1 microsecond; bin i >= 1 holds [GROWTH^(i-1), GROWTH^i) us.
local function histogram_bin(duration_s)
  local us = duration_s * 1000000
  if us < 1 then return 0 end
  return math.floor(math.log(us) / math.log(HISTOGRAM_GROWTH)) + 1
end

local function count(bucket, task, what, by)
  redis.call('HINCRBY', bucket, task .. '|' .. what, by)
end

local function observe(bucket, task, wait_s, run_s)
  if wait_s < 0 then wait_s = 0 end
  if run_s < 0 then run_s = 0 end
  redis.call('HINCRBY', bucket, task .. '|w|' .. histogram_bin(wait_s), 1)
  redis.call('HINCRBY', bucket, task .. '|r|' .. histogram_bin(run_s), 1)
  redis.call('HINCRBYFLOAT', bucket, task .. '|wsum', wait_s)
  redis.call('HINCRBYFLOAT', bucket, task .. '|rsum', run_s)
end

local function touch_bucket(bucket, ttl)
  redis.call('EXPIRE', bucket, ttl)
end
