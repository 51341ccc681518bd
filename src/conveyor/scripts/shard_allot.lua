#!lua
--!df flags=allow-undeclared-keys
-- Read, or write, one shard's share of its sharded queue's concurrency cap (see
-- conveyor.sharding). The shares are moved by one rebalancing round at a time: each round
-- has a higher epoch, and a shard refuses a round older than the newest it has seen, so a
-- round that stalled (its process paused past its lock) can no longer write once a newer
-- one has read this shard. A share is never set below the jobs running on the shard now:
-- what a round takes away is only what the shard does not use, so the shares never add up
-- to more than the cap. A share that rises lets parked tenants back and wakes a worker.
--
-- K.limits
-- K.parked
-- K.ready_prefix
-- K.ring_prefix
-- K.priorities
-- K.wake
-- K.counts
-- K.shard_epoch      the newest round that read or wrote this shard
-- A.epoch            this round's epoch (an integer > 0)
-- A.share            '' to read only, '-' to remove the share (no cap), else the share
--                    wanted (an integer >= 0; the jobs running now if more)
-- Returns: {status, share ('' when none), running, ready, the newest epoch seen}; status
-- 'ok' or 'stale' (a newer round has seen this shard: nothing was written)
--@include ready
--@include flow

local epoch, share = tonumber(A.epoch), A.share
local wanted = tonumber(share)
if not epoch or epoch < 1 or epoch ~= math.floor(epoch)
    or (share ~= '' and share ~= '-' and (not wanted or wanted < 0 or wanted ~= math.floor(wanted))) then
  return redis.error_reply('ERR shard_allot: needs an epoch >= 1 and a share that is empty, '
    .. "'-' or an integer >= 0")
end
local seen = tonumber(redis.call('GET', K.shard_epoch)) or 0
local running = tonumber(redis.call('HGET', K.counts, 'running')) or 0
local ready = tonumber(redis.call('HGET', K.counts, 'ready')) or 0
local now = redis.call('HGET', K.limits, 'concurrency')
if epoch < seen then
  return { 'stale', now or '', running, ready, seen }
end
redis.call('SET', K.shard_epoch, epoch)
if share == '' then return { 'ok', now or '', running, ready, epoch } end
local before = tonumber(now)
if share == '-' then
  redis.call('HDEL', K.limits, 'concurrency')
  wanted = nil
else
  if wanted < running then wanted = running end
  redis.call('HSET', K.limits, 'concurrency', wanted)
end
if before ~= nil and (wanted == nil or wanted > before) then
  flow_unpark_all(K)
  if ready > 0 then wake_one(K.wake) end
end
return { 'ok', wanted and tostring(wanted) or '', running, ready, epoch }
