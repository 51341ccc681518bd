-- Housekeeping that every fetch does first, so no separate reaper or scheduler is needed:
-- promote delayed jobs that have come due, and reclaim leases whose deadline has passed.

-- Move due delayed jobs to the front of their ready lists, earliest due first: they have
-- already waited, so they go ahead of jobs of their priority and tenant queued without delay.
local function promote_due(delayed, job_prefix, ready_prefix, ring_prefix, priorities, counts,
                           now, limit)
  local due = redis.call('ZRANGE', delayed, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  local promoted = 0
  for i = #due, 1, -1 do
    local id = due[i]
    redis.call('ZREM', delayed, id)
    local job = redis.call('HMGET', job_prefix .. id, 'state', 'priority', 'tenant')
    if job[1] == 'scheduled' or job[1] == 'retrying' then
      redis.call('HSET', job_prefix .. id, 'state', 'ready')
      push_ready(ready_prefix, ring_prefix, priorities, id, job[2] or '5', job[3] or '', true)
      promoted = promoted + 1
    end
  end
  if promoted > 0 then redis.call('HINCRBY', counts, 'ready', promoted) end
  return promoted
end

-- A lease past its deadline means the worker died or stalled. The attempt it used counts;
-- the job goes back to the front of its list, or to the dead letters when attempts are spent.
-- Returns the short ids that went dead, and the records of those (for the event stream).
local function reclaim_expired(k, now, limit, cfg, tally)
  local expired = redis.call('ZRANGE', k.leases, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  local dead_ids = {}
  for _, id in ipairs(expired) do
    redis.call('ZREM', k.leases, id)
    local key = k.job_prefix .. id
    local f = redis.call('HMGET', key, 'state', 'task', 'attempts', 'max_attempts',
      'priority', 'tenant', 'key', 'enqueued_at', 'run_at', 'started_at')
    if f[1] == 'active' then
      -- A hand-edited or partly written record must not make the fetch fail.
      f[2], f[3], f[5], f[6] = f[2] or '', f[3] or '1', f[5] or '5', f[6] or ''
      local job = { task = f[2], attempts = f[3], priority = f[5], tenant = f[6],
        enqueued_at = f[8], run_at = f[9], started_at = f[10] }
      release_active(k.active, f[2])
      local err = 'lease expired: the worker died or stalled (attempt ' .. f[3] .. ')'
      count(tally, f[2], 'failed', 1)
      if (tonumber(f[3]) or 1) >= (tonumber(f[4]) or 1) then
        job.state, job.error, job.finished_at = 'dead', err, seconds(now)
        redis.call('HSET', key, 'state', 'dead', 'token', '', 'error', err,
          'finished_at', job.finished_at)
        bury(k.dead, k.job_prefix, id, now, cfg.dead_cap)
        free_dedupe_key(k.dedupe_prefix, f[7], id)
        emit_event(k.events, cfg.events_maxlen, id, job)
        count(tally, f[2], 'dead', 1)
        dead_ids[#dead_ids + 1] = id
      else
        redis.call('HSET', key, 'state', 'ready', 'token', '', 'error', err)
        push_ready(k.ready_prefix, k.ring_prefix, k.priorities, id, f[5], f[6], true)
        redis.call('HINCRBY', k.counts, 'ready', 1)
        count(tally, f[2], 'retried', 1)
      end
    end
  end
  return dead_ids
end
