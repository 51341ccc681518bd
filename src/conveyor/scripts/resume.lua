#!lua
--!df flags=allow-undeclared-keys
-- Parents learn that their child jobs ended (ctx.child): each child's outcome is recorded
-- as its parent's wait, and a parent that is suspended resumes. Only a parent whose 'wt'
-- still names that child is changed, so telling the same end twice (a drainer killed
-- after this call and before it removed its outbox entry) changes nothing the second time.
--
-- K.job_prefix
-- K.delayed
-- K.counts
-- K.ready_prefix
-- K.ring_prefix
-- K.priorities
-- K.wake
-- K.suspended
-- A.ends       number of ends that follow, 3 fields each: parent's short id, the child's
--              job id, the outcome to record ('o' .. result, 'd' .. error, 'c' .. reason)
-- Returns: the number of parents that became ready
--@include suspend

local ENDED_STATES = { succeeded = true, dead = true, cancelled = true, expired = true }
local n = tonumber(A.ends)
if not n or #ARGV ~= ITEM.first - 1 + n * ITEM.fields then
  return redis.error_reply('ERR resume: expected ' .. tostring(A.ends) .. ' ends of '
    .. ITEM.fields .. ' fields')
end
local wrong = resume_keys_problem('resume', K)
if wrong then return redis.error_reply(wrong) end
local resumed = 0
for i = 0, n - 1 do
  local base = ITEM.first + i * ITEM.fields
  local parent, child = ARGV[base + ITEM.parent], ARGV[base + ITEM.child]
  local f = redis.pcall('HMGET', K.job_prefix .. parent, 's', 'wt', 'p', 'tenant')
  -- An ended parent (cancelled while it waited) has nothing to learn: it keeps its record.
  local live = type(f[1]) == 'string' and not ENDED_STATES[f[1]]
  local w = live and parse_wait(f[2]) or nil
  if w and w.kind == 'child' and w.child == child then
    if f[1] == 'suspended' then resumed = resumed + 1 end
    record_wait(K, parent, w, ARGV[base + ITEM.outcome],
      { state = f[1], priority = f[3], tenant = f[4] })
  end
end
return resumed
