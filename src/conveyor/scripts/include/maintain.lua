-- Housekeeping that every fetch does first, so no separate reaper or scheduler is needed:
-- promote delayed jobs that have come due, and reclaim leases whose deadline has passed.

-- Move due delayed jobs to the front of their ready lists, earliest due first: they have
-- already waited, so they go ahead of jobs of their priority and tenant queued without delay.
local function promote_due(k, now, limit, cfg, tally, out)
  local due = redis.call('ZRANGE', k.delayed, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  local promoted = 0
  for i = #due, 1, -1 do
    local id = due[i]
    redis.call('ZREM', k.delayed, id)
    local r = read_record(k.job_prefix .. id)
    if r.state == 'scheduled' or r.state == 'retrying' then
      local bad = record_problem(r)
      if bad then
        dead_letter(k, cfg, tally, now, id, r, bad, out)
      else
        redis.call('HSET', k.job_prefix .. id, 'state', 'ready')
        push_ready(k.ready_prefix, k.ring_prefix, k.priorities, id, r.priority or '5',
          r.tenant or '', true)
        promoted = promoted + 1
      end
    end
  end
  if promoted > 0 then redis.call('HINCRBY', k.counts, 'ready', promoted) end
  return promoted
end

-- A lease past its deadline means the worker died or stalled. The attempt it used counts;
-- the job goes back to the front of its list, or to the dead letters when attempts are spent
-- (added to out.dead, with any dead letters the cap trimmed in out.trimmed).
local function reclaim_expired(k, now, limit, cfg, tally, out)
  local expired = redis.call('ZRANGE', k.leases, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  for _, id in ipairs(expired) do
    redis.call('ZREM', k.leases, id)
    local key = k.job_prefix .. id
    local r = read_record(key)
    if r.state == 'active' then
      release_active(k.active, r.task)
      flow_ended(k, 1, { [r.tenant or ''] = 1 })
      count(tally, r.task, 'failed', 1)
      local attempts = r.attempts or '1'
      local err = 'lease expired: the worker died or stalled (attempt ' .. attempts .. ')'
      local bad = record_problem(r)
      if bad then
        dead_letter(k, cfg, tally, now, id, r, bad, out)
      elseif (tonumber(attempts) or 1) >= (tonumber(r.max_attempts) or 1) then
        dead_letter(k, cfg, tally, now, id, r, err, out)
      else
        redis.call('HSET', key, 'state', 'ready', 'token', '', 'error', err)
        push_ready(k.ready_prefix, k.ring_prefix, k.priorities, id, r.priority or '5',
          r.tenant or '', true)
        redis.call('HINCRBY', k.counts, 'ready', 1)
        count(tally, r.task, 'retried', 1)
      end
    end
  end
end
