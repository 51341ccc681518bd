-- Workflow nodes waiting for their parents. A waiting node's record says 'scheduled' and
-- carries 'wfw' (how many parents must end first); it is in no ready list and not in the
-- delayed set, so no fetch can take it. Its waiting hash (waiting_prefix .. id) holds one
-- field per parent that ended: '' when the parent succeeded, else the reason its
-- 'succeeded' children are cancelled. HSETNX on that hash makes a repeated hand-over of
-- the same parent a no-op; only a record still waiting ('wfw' present) is ever released.
--@include clock
--@include ready

-- Leave the waiting state cancelled, and queue the node's own hand-over so that its
-- children learn of it (the cancellation cascades, slot by slot, through the outboxes).
local function cancel_waiting(k, id, reason, now, retention)
  local key = k.job_prefix .. id
  redis.call('HSET', key, 's', 'cancelled', 'error', reason, 'finished_at', seconds(now))
  redis.call('HDEL', key, 'wfw')
  redis.call('EXPIRE', key, retention)
  redis.call('DEL', k.waiting_prefix .. id)
  redis.call('RPUSH', k.handover, id .. ' ' .. string.format('%.3f', now))
end

-- Every parent ended: the node becomes ready, or scheduled when it has a time to wait for
-- (an at= time, or a delay counted from now). Either way its run_at says from when it
-- could run. Returns 1 if it became ready, else 0.
local function release_waiting(k, id, now)
  local key = k.job_prefix .. id
  local f = redis.call('HMGET', key, 'p', 'tenant', 'run_at', 'wfd')
  redis.call('HDEL', key, 'wfw', 'wfd')
  redis.call('DEL', k.waiting_prefix .. id)
  local due = now + (tonumber(f[4]) or 0)
  local at = (tonumber(f[3]) or 0) * 1000
  if at > due then due = at end
  if due > now then
    redis.call('HSET', key, 'run_at', seconds(due))
    redis.call('ZADD', k.delayed, due, id)
    return 0
  end
  -- run_at: when it became runnable, so that its wait time (and the task type's wait
  -- percentiles) counts from there, not from the enqueue of the whole workflow.
  redis.call('HSET', key, 's', 'ready', 'run_at', seconds(now))
  push_ready(k.ready_prefix, k.ring_prefix, k.priorities, id, f[1] or '5', f[2] or '', false)
  return 1
end

-- Decide a waiting node after its waiting hash changed. `failure` is the reason of the
-- parent that just ended, '' if it succeeded, or nil to look at every ended parent (when
-- the node is stored after some of its parents had already ended).
-- Returns 'ready', 'scheduled', 'cancelled', or nil while it keeps waiting (or is no
-- waiting node at all: then nothing changes).
local function settle_waiting(k, id, failure, now, retention)
  local f = redis.call('HMGET', k.job_prefix .. id, 's', 'wfw', 'wfr')
  if f[1] ~= 'scheduled' or not f[2] then
    if not f[1] then
      -- No such record (yet, or any more): keep what was learnt for a while, not for ever.
      redis.call('EXPIRE', k.waiting_prefix .. id, retention)
    else
      redis.call('DEL', k.waiting_prefix .. id)
    end
    return nil
  end
  if f[3] ~= 'finished' then
    if failure == nil then
      for _, reason in ipairs(redis.call('HVALS', k.waiting_prefix .. id)) do
        if reason ~= '' then failure = reason; break end
      end
    end
    if failure ~= nil and failure ~= '' then
      cancel_waiting(k, id, failure, now, retention)
      return 'cancelled'
    end
  end
  if redis.call('HLEN', k.waiting_prefix .. id) < (tonumber(f[2]) or 0) then return nil end
  if release_waiting(k, id, now) == 1 then return 'ready' end
  return 'scheduled'
end
