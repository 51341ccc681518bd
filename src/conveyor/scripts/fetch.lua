#!lua
--!df flags=allow-undeclared-keys
-- Lease up to `count` ready jobs to a worker, after promoting due delayed jobs and
-- reclaiming expired leases. Each leased job gets a fresh fencing token: the queue's
-- counter joined with a random nonce of this call, so that a token is never handed out
-- twice, also after Redis rolled back to an older state (failover to a lagging replica,
-- restore from a snapshot) and its counter with it.
-- A record that cannot be run as it stands (a field that must be a number is not, a
-- state that is no job state) is dead-lettered here with a reason naming the field.
--
-- K.job_prefix
-- K.ready_prefix
-- K.ring_prefix
-- K.priorities
-- K.delayed
-- K.leases
-- K.dead
-- K.counts
-- K.active
-- K.seq
-- K.dedupe_prefix
-- K.events
-- K.metrics_prefix
-- K.wake
-- K.paused
-- K.limits
-- K.buckets
-- K.running
-- K.parked
-- K.waiters
-- K.waiter_offers
-- K.suspended
-- K.expiring
-- K.cancelling
-- A.now                   '' for the server clock (ms override, tests only)
-- A.want                  most jobs to lease (the worker's free slots)
-- A.dead_cap              most dead letters kept
-- A.events_maxlen         approximate cap of the events stream
-- A.bucket_seconds        width of a metric bucket
-- A.bucket_ttl            lifetime of a metric bucket (s)
-- A.nonce                 random text of this call, part of every token it hands out
-- A.worker                '' or the worker's id: named on each job it leases (include/
--                         lease.lua); with A.waiter_ttl_ms > 0 its registration as a waiter
--                         (include/handoff.lua) is replaced too, offering the slots this
--                         call leaves free (count - jobs leased), or removed when none are
-- A.waiter_ttl_ms         how long that registration holds; 0 leaves registrations alone
-- A.retention             seconds a record that ends here (expired) is kept
-- Limits (flow.lua) are decided here, atomically with priorities and tenant turns; the next
-- due time includes when a parked tenant or the queue's bucket has a token again.
-- Returns: { now_ms, next_due_ms ('' if none), dead short ids (lost leases, bad records),
--            jobs: flat, 10 fields each: short id, token, task, args, attempts,
--            max_attempts, enqueued_at, run_at, vt, '1' if the run must tell its start
--            before it begins (heartbeat.lua) else '';
--            short ids of dead letters deleted by the cap meanwhile,
--            1 if limits held back ready jobs (a burst worker waits for them) else 0,
--            short ids of jobs that expired (include/expiry.lua),
--            the highest priority that has ready jobs left ('' if none) }
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

local want, nonce = tonumber(A.want), A.nonce
local cfg = { dead_cap = tonumber(A.dead_cap), events_maxlen = tonumber(A.events_maxlen),
  bucket_seconds = tonumber(A.bucket_seconds), bucket_ttl = tonumber(A.bucket_ttl),
  retention = tonumber(A.retention) }
if not want or want < 0 or not cfg.dead_cap or not cfg.events_maxlen
    or not cfg.bucket_seconds or not cfg.bucket_ttl then
  return redis.error_reply('ERR fetch: count, dead_cap, events_maxlen, bucket_seconds and '
    .. 'bucket_ttl must be numbers')
end
if not nonce or nonce == '' then return redis.error_reply('ERR fetch: nonce must be set') end
local wrong = wrong_key_type('fetch', { K.priorities, 'zset', K.delayed, 'zset',
  K.leases, 'zset', K.dead, 'zset', K.counts, 'hash', K.active, 'hash', K.seq, 'string',
  K.events, 'stream', K.limits, 'hash', K.buckets, 'hash', K.running, 'hash',
  K.parked, 'zset' })
if wrong then return redis.error_reply(wrong) end
-- The token counter is first incremented after a job is popped: one that is no integer
-- would fail the fetch there, with that job off its ready list and in no lease.
local seq = not_a_counter(K.seq)
if seq then
  return redis.error_reply('ERR fetch: key ' .. K.seq .. ' holds ' .. quoted(seq)
    .. ', not an integer (written over by hand?); nothing was changed')
end

local now = now_ms(A.now)
local tally = new_tally()
local out = { dead = {}, trimmed = {}, expired = {} }
reclaim_expired(K, now, 100, cfg, tally, out)
promote_due(K, now, 1000, cfg, tally, out)
local next_expiry = expire_due(K, now, 1000, cfg, tally, out)

local acc = new_lease_batch(A.worker)
local take = lease_taker(K, cfg, tally, out, now, want, nonce, acc)
local taken, refill, lim, held = 0, nil, nil, false
if redis.call('EXISTS', K.paused) == 0 then
  taken, refill, lim = claim_ready(K, now, want, take)
  record_leases(K, tally, acc)
  flow_started(K, taken, acc.by_tenant)
  -- More ready jobs than this worker had slots for: wake another (under limits, only when
  -- the worker's slots and not a limit stopped the claim).
  if taken > 0 and (not lim or taken == want) and redis.call('ZCARD', K.priorities) > 0 then
    wake_one(K.wake)
  end
  if lim and taken < want then  -- did a limit hold back ready jobs?
    held = (tonumber(redis.call('HGET', K.counts, 'ready')) or 0) > 0
  end
  if not held then refill = nil end
end
write_tally(tally, bucket_key(K.metrics_prefix, now, cfg.bucket_seconds), cfg.bucket_ttl)
renew_waiter(K, A.worker, want - taken, nonce, now, tonumber(A.waiter_ttl_ms))

local next_due = refill or next_expiry or ''
if refill and next_expiry and next_expiry < refill then next_due = next_expiry end
for _, set in ipairs({ K.delayed, K.leases, K.parked }) do
  local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  if #first > 0 and (next_due == '' or tonumber(first[2]) < next_due) then
    next_due = tonumber(first[2])
  end
end
local top = redis.call('ZRANGE', K.priorities, -1, -1)
return { string.format('%.3f', now), next_due == '' and '' or string.format('%.3f', next_due),
  out.dead, acc.jobs, out.trimmed, held and 1 or 0, out.expired, top[1] or '' }
