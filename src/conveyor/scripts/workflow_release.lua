#!lua
-- The child side of a workflow hand-over: tell waiting nodes of this queue that a parent
-- ended. Idempotent: a parent is recorded once per child (HSETNX), and only a node still
-- waiting is released or cancelled, so a hand-over repeated by a retry, by a second worker
-- or after a crash changes nothing. A node is released exactly when its last parent is
-- recorded: made ready (or scheduled), or cancelled with the reason when a parent died or
-- was cancelled and the node runs only after successes (run_if 'succeeded').
--
-- KEYS[1] job_prefix
-- KEYS[2] ready_prefix
-- KEYS[3] ring_prefix
-- KEYS[4] priorities
-- KEYS[5] delayed
-- KEYS[6] counts
-- KEYS[7] wake
-- KEYS[8] handover         this queue's hand-over outbox (a cancelled node's own children)
-- KEYS[9] waiting_prefix   waiting hashes: waiting_prefix .. short id
-- ARGV[1] now              '' for the server clock (ms override, tests only)
-- ARGV[2] retention        seconds a cancelled record is kept
-- ARGV[3] handovers        number of hand-overs that follow, 3 fields each:
--         child short id, parent public id, outcome ('' succeeded, else the reason)
-- Returns: { nodes made ready or scheduled, nodes cancelled }
--@include clock
--@include ready
--@include workflow
--@include key_types

local k = { job_prefix = KEYS[1], ready_prefix = KEYS[2], ring_prefix = KEYS[3],
  priorities = KEYS[4], delayed = KEYS[5], counts = KEYS[6], wake = KEYS[7],
  handover = KEYS[8], waiting_prefix = KEYS[9] }
local retention, n = tonumber(ARGV[2]), tonumber(ARGV[3])
local FIELDS, FIRST = 3, 4
if not retention or not n or #ARGV ~= FIRST - 1 + n * FIELDS then
  return redis.error_reply('ERR workflow_release: expected a numeric retention and '
    .. tostring(n) .. ' hand-overs of ' .. FIELDS .. ' fields')
end
for i = 0, n - 1 do
  if ARGV[FIRST + i * FIELDS] == '' or ARGV[FIRST + i * FIELDS + 1] == '' then
    return redis.error_reply('ERR workflow_release: hand-over ' .. i .. ' names no node')
  end
end
local wrong = wrong_key_type('workflow_release', { k.priorities, 'zset', k.delayed, 'zset',
  k.counts, 'hash', k.handover, 'list' })
if wrong then return redis.error_reply(wrong) end

local now = now_ms(ARGV[1])
local released, cancelled, ready, scheduled = 0, 0, 0, 0
for i = 0, n - 1 do
  local base = FIRST + i * FIELDS
  local child, parent, outcome = ARGV[base], ARGV[base + 1], ARGV[base + 2]
  if redis.call('HSETNX', k.waiting_prefix .. child, parent, outcome) == 1 then
    local became = settle_waiting(k, child, outcome, now, retention)
    if became == 'cancelled' then
      cancelled = cancelled + 1
    elseif became ~= nil then
      released = released + 1
      if became == 'ready' then ready = ready + 1 else scheduled = scheduled + 1 end
    end
  end
end
made_ready(k.counts, k.wake, ready)
-- A node now due later may be the queue's earliest: idle workers must re-arm their timers.
if scheduled > 0 then wake_one(k.wake) end
return { released, cancelled }
