#!lua
--!df flags=allow-undeclared-keys
-- The child side of a workflow hand-over: tell waiting nodes of this queue that a parent
-- ended. Idempotent: a parent is recorded once per child (HSETNX), and only a node still
-- waiting is released or cancelled, so a hand-over repeated by a retry, by a second worker
-- or after a crash changes nothing. A node is released exactly when its last parent is
-- recorded: made ready (or scheduled), or cancelled with the reason when a parent died or
-- was cancelled and the node runs only after successes (run_if 'succeeded').
--
-- K.job_prefix
-- K.ready_prefix
-- K.ring_prefix
-- K.priorities
-- K.delayed
-- K.counts
-- K.wake
-- K.handover               this queue's hand-over outbox (a cancelled node's own children)
-- K.waiting_prefix         waiting hashes: waiting_prefix .. short id
-- A.now                    '' for the server clock (ms override, tests only)
-- A.retention              seconds a cancelled record is kept
-- A.handovers              number of hand-overs that follow, 3 fields each:
--         child short id, parent public id, outcome ('' succeeded, else the reason)
-- Returns: { nodes made ready or scheduled, nodes cancelled }
--@include clock
--@include ready
--@include workflow
--@include key_types

local retention, n = tonumber(A.retention), tonumber(A.handovers)
local FIELDS, FIRST = ITEM.fields, ITEM.first
if not retention or not n or #ARGV ~= FIRST - 1 + n * FIELDS then
  return redis.error_reply('ERR workflow_release: expected a numeric retention and '
    .. tostring(n) .. ' hand-overs of ' .. FIELDS .. ' fields')
end
for i = 0, n - 1 do
  local base = FIRST + i * FIELDS
  if ARGV[base + ITEM.child] == '' or ARGV[base + ITEM.parent] == '' then
    return redis.error_reply('ERR workflow_release: hand-over ' .. i .. ' names no node')
  end
end
local wrong = wrong_key_type('workflow_release', { K.priorities, 'zset', K.delayed, 'zset',
  K.counts, 'hash', K.handover, 'list' })
if wrong then return redis.error_reply(wrong) end

local now = now_ms(A.now)
local released, cancelled, ready, scheduled = 0, 0, 0, 0
for i = 0, n - 1 do
  local base = FIRST + i * FIELDS
  local child, parent = ARGV[base + ITEM.child], ARGV[base + ITEM.parent]
  local outcome = ARGV[base + ITEM.outcome]
  if redis.call('HSETNX', K.waiting_prefix .. child, parent, outcome) == 1 then
    local became = settle_waiting(K, child, outcome, now, retention)
    if became == 'cancelled' then
      cancelled = cancelled + 1
    elseif became ~= nil then
      released = released + 1
      if became == 'ready' then ready = ready + 1 else scheduled = scheduled + 1 end
    end
  end
end
made_ready(K.counts, K.wake, ready)
-- A node now due later may be the queue's earliest: idle workers must re-arm their timers.
if scheduled > 0 then wake_one(K.wake) end
return { released, cancelled }
