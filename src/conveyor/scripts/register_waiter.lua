#!lua
--!df flags=allow-undeclared-keys
-- Register an idle worker as a waiter of a queue (see include/handoff.lua): the next
-- enqueue that makes jobs ready leases up to `slots` of them to it and pushes them onto its
-- hand-off list. Replaces the worker's registration, if any, and drops lapsed ones of any
-- worker (one that died while registered).
--
-- K.waiters               zset worker id -> when its registration lapses (ms)
-- K.waiter_offers         hash worker id -> '<slots>:<nonce>'
-- A.now                   '' for the server clock (ms override, tests only)
-- A.worker                the worker's id
-- A.slots                 free slots it offers (> 0)
-- A.nonce                 hex; part of the fencing tokens of jobs handed to it
-- A.ttl_ms                how long the registration holds
-- Returns: the server time (ms) as text
--@include clock
--@include handoff

local worker, slots, nonce, ttl_ms = A.worker, tonumber(A.slots), A.nonce, tonumber(A.ttl_ms)
if worker == '' or not slots or slots < 1 or not ttl_ms or ttl_ms <= 0
    or not string.match(nonce, '^%x+$') then
  return redis.error_reply('ERR register_waiter: needs a worker, slots >= 1, a hex nonce '
    .. 'and ttl_ms > 0')
end
local now = now_ms(A.now)
-- A waiters key of the wrong type registers nobody (see drop_waiter): the worker waits for
-- its wake-ups as it would without hand-offs.
local lapsed = redis.pcall('ZRANGE', K.waiters, '-inf', string.format('%.3f', now),
  'BYSCORE', 'LIMIT', 0, 100)
for _, worker_id in ipairs(lapsed.err and {} or lapsed) do drop_waiter(K, worker_id) end
offer_slots(K, worker, math.floor(slots), nonce, now, ttl_ms)
return string.format('%.3f', now)
