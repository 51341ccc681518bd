#!lua
-- Lease up to `count` ready jobs to a worker, after promoting due delayed jobs and
-- reclaiming expired leases. Each leased job gets a fresh fencing token: the queue's
-- counter joined with a random nonce of this call, so that a token is never handed out
-- twice, also after Redis rolled back to an older state (failover to a lagging replica,
-- restore from a snapshot) and its counter with it.
-- A record that cannot be run as it stands (a field that must be a number is not, a
-- state that is no job state) is dead-lettered here with a reason naming the field.
--
-- KEYS[1]  job_prefix
-- KEYS[2]  ready_prefix
-- KEYS[3]  ring_prefix
-- KEYS[4]  priorities
-- KEYS[5]  delayed
-- KEYS[6]  leases
-- KEYS[7]  dead
-- KEYS[8]  counts
-- KEYS[9]  active
-- KEYS[10] seq
-- KEYS[11] dedupe_prefix
-- KEYS[12] events
-- KEYS[13] metrics_prefix
-- KEYS[14] wake
-- KEYS[15] paused
-- KEYS[16] limits
-- KEYS[17] buckets
-- KEYS[18] running
-- KEYS[19] parked
-- KEYS[20] waiters
-- KEYS[21] waiter_offers
-- ARGV[1] now             '' for the server clock (ms override, tests only)
-- ARGV[2] want            most jobs to lease (the worker's free slots)
-- ARGV[3] dead_cap        most dead letters kept
-- ARGV[4] events_maxlen   approximate cap of the events stream
-- ARGV[5] bucket_seconds  width of a metric bucket
-- ARGV[6] bucket_ttl      lifetime of a metric bucket (s)
-- ARGV[7] nonce           random text of this call, part of every token it hands out
-- ARGV[8] worker          '' or the worker's id: its registration as a waiter
--                         (include/handoff.lua) is replaced, offering the slots this call
--                         leaves free (count - jobs leased), or removed when none are
-- ARGV[9] waiter_ttl_ms   how long that registration holds
-- Limits (flow.lua) are decided here, atomically with priorities and tenant turns; the next
-- due time includes when a parked tenant or the queue's bucket has a token again.
-- Returns: { now_ms, next_due_ms ('' if none), dead short ids (lost leases, bad records),
--            jobs: flat, 9 fields each: short id, token, task, args, attempts,
--            max_attempts, enqueued_at, run_at, vt;
--            short ids of dead letters deleted by the cap meanwhile,
--            1 if limits held back ready jobs (a burst worker waits for them) else 0 }
--@include clock
--@include ready
--@include metrics
--@include finish
--@include records
--@include flow
--@include maintain
--@include flow_claim
--@include lease
--@include handoff
--@include key_types

local k = { job_prefix = KEYS[1], ready_prefix = KEYS[2], ring_prefix = KEYS[3],
  priorities = KEYS[4], delayed = KEYS[5], leases = KEYS[6], dead = KEYS[7],
  counts = KEYS[8], active = KEYS[9], seq = KEYS[10], dedupe_prefix = KEYS[11],
  events = KEYS[12], metrics_prefix = KEYS[13], wake = KEYS[14], paused = KEYS[15],
  limits = KEYS[16], buckets = KEYS[17], running = KEYS[18], parked = KEYS[19],
  waiters = KEYS[20], waiter_offers = KEYS[21] }
local want, nonce = tonumber(ARGV[2]), ARGV[7]
local cfg = { dead_cap = tonumber(ARGV[3]), events_maxlen = tonumber(ARGV[4]),
  bucket_seconds = tonumber(ARGV[5]), bucket_ttl = tonumber(ARGV[6]) }
if not want or want < 0 or not cfg.dead_cap or not cfg.events_maxlen
    or not cfg.bucket_seconds or not cfg.bucket_ttl then
  return redis.error_reply('ERR fetch: count, dead_cap, events_maxlen, bucket_seconds and '
    .. 'bucket_ttl must be numbers')
end
if not nonce or nonce == '' then return redis.error_reply('ERR fetch: nonce must be set') end
local wrong = wrong_key_type('fetch', { k.priorities, 'zset', k.delayed, 'zset',
  k.leases, 'zset', k.dead, 'zset', k.counts, 'hash', k.active, 'hash', k.seq, 'string',
  k.events, 'stream', k.limits, 'hash', k.buckets, 'hash', k.running, 'hash',
  k.parked, 'zset' })
if wrong then return redis.error_reply(wrong) end
-- The token counter is first incremented after a job is popped: one that is no integer
-- would fail the fetch there, with that job off its ready list and in no lease.
local seq = not_a_counter(k.seq)
if seq then
  return redis.error_reply('ERR fetch: key ' .. k.seq .. ' holds ' .. quoted(seq)
    .. ', not an integer (written over by hand?); nothing was changed')
end

local now = now_ms(ARGV[1])
local tally = new_tally()
local out = { dead = {}, trimmed = {} }
reclaim_expired(k, now, 100, cfg, tally, out)
promote_due(k, now, 1000, cfg, tally, out)

local acc = new_lease_batch()
local take = lease_taker(k, cfg, tally, out, now, want, nonce, acc)
local taken, refill, lim, held = 0, nil, nil, false
if redis.call('EXISTS', k.paused) == 0 then
  taken, refill, lim = claim_ready(k, now, want, take)
  record_leases(k, tally, acc)
  flow_started(k, taken, acc.by_tenant)
  -- More ready jobs than this worker had slots for: wake another (under limits, only when
  -- the worker's slots and not a limit stopped the claim).
  if taken > 0 and (not lim or taken == want) and redis.call('ZCARD', k.priorities) > 0 then
    wake_one(k.wake)
  end
  if lim and taken < want then  -- did a limit hold back ready jobs?
    held = (tonumber(redis.call('HGET', k.counts, 'ready')) or 0) > 0
  end
  if not held then refill = nil end
end
write_tally(tally, bucket_key(k.metrics_prefix, now, cfg.bucket_seconds), cfg.bucket_ttl)
renew_waiter(k, ARGV[8], want - taken, nonce, now, tonumber(ARGV[9]))

local next_due = refill or ''
for _, set in ipairs({ k.delayed, k.leases, k.parked }) do
  local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  if #first > 0 and (next_due == '' or tonumber(first[2]) < next_due) then
    next_due = tonumber(first[2])
  end
end
return { string.format('%.3f', now), next_due == '' and '' or string.format('%.3f', next_due),
  out.dead, acc.jobs, out.trimmed, held and 1 or 0 }
