-- The hand-off of include/handoff.lua as enqueue.lua makes it, with its KEYS and ARGV.
--@include handoff

-- After an enqueue stored its jobs, `n_ready` of them ready: hand those to a live waiter,
-- or wake a worker. Returns the number handed over.
local function enqueue_hand_off(now, n_ready)
  if n_ready == 0 or redis.call('EXISTS', K.waiters) == 0 then
    wake_one(K.wake)
    return 0
  end
  local cfg = { dead_cap = tonumber(A.dead_cap), events_maxlen = tonumber(A.events_maxlen),
    bucket_seconds = tonumber(A.bucket_seconds), bucket_ttl = tonumber(A.bucket_ttl) }
  return hand_off_or_wake(K, cfg, now, n_ready)
end
