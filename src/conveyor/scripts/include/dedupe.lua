-- Jobs enqueued with a key: dedupe (one unfinished job per key), debounce (the pending job
-- moves later and takes the latest arguments) and throttle (the key stays taken for a
-- window from the first enqueue, even after that job finished).
--@include clock

-- The job that holds dedupe key `key`, or nil when the key is free: it names no job, or
-- one whose record is gone. An enqueue with the key returns that job; a job requeued from
-- the dead letters takes the key back only when it is free (requeue_dead.lua).
local function key_holder(job_prefix, dedupe_prefix, key)
  local holder = redis.call('GET', dedupe_prefix .. key)
  if not holder or redis.call('EXISTS', job_prefix .. holder) == 0 then return nil end
  return holder
end

-- The job an enqueue with `key` returns instead of creating one, or nil to create one.
-- k: { job_prefix, dedupe_prefix, throttle_prefix, delayed }; o: { key, args, now,
-- debounce_ms, throttle } (debounce_ms nil when the enqueue does not debounce).
local function dedupe_existing(k, o)
  if o.throttle then
    local held = redis.call('GET', k.throttle_prefix .. o.key)
    if held then return held end
  end
  local existing = key_holder(k.job_prefix, k.dedupe_prefix, o.key)
  if not existing then return nil end
  if not o.debounce_ms then return existing end
  local job = k.job_prefix .. existing
  local f = redis.call('HMGET', job, 's', 'debounce_until')
  -- A debounced job that has started (or is ready) is left alone: a new one is made.
  if f[1] ~= 'scheduled' then return nil end
  local due = o.now + o.debounce_ms
  local bound = tonumber(f[2])
  if bound and bound < due then due = bound end
  redis.call('HSET', job, 'a', o.args, 'run_at', seconds(due))
  redis.call('ZADD', k.delayed, due, existing)
  return existing
end

-- After creating a keyed job: the key points at it (and, throttled, for `throttle_ms`).
local function dedupe_created(k, key, id, throttle_ms)
  redis.call('SET', k.dedupe_prefix .. key, id)
  if throttle_ms then
    redis.call('SET', k.throttle_prefix .. key, id, 'PX', math.max(1, math.floor(throttle_ms)))
  end
end
