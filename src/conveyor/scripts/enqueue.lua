#!lua
--!df flags=allow-undeclared-keys
-- Store a batch of new jobs of one task with the same options, and make them ready (or
-- scheduled, when due later). Options are sent once per batch, not once per job.
--
-- K.job_prefix            job record hashes: job_prefix .. short id
-- K.ready_prefix          ready lists: ready_prefix .. priority .. ':' .. tenant
-- K.ring_prefix           tenant rings: ring_prefix .. priority
-- K.priorities            zset of priorities with ready jobs
-- K.delayed               zset short id -> due time (ms)
-- K.counts                hash: ready
-- K.dedupe_prefix         dedupe keys: dedupe_prefix .. key -> short id
-- K.wake                  wake marker list
-- K.metrics_prefix        metric buckets
-- K.schedule_prefix latest tick claimed per periodic (fired or recorded): .. name -> ms
-- K.fired_prefix    latest tick per periodic that stored its job: fired_prefix .. name -> ms
-- K.throttle_prefix throttle windows: throttle_prefix .. key -> short id (expires)
-- K.leases
-- K.dead
-- K.active
-- K.seq
-- K.events
-- K.paused
-- K.limits
-- K.buckets
-- K.running
-- K.parked
-- K.waiters
-- K.waiter_offers
-- K.handoff_prefix
-- K.expiring
-- A.now                   '' for the server clock (ms override, tests only)
-- A.bucket_seconds        width of a metric bucket
-- A.bucket_ttl            lifetime of a metric bucket (s)
-- A.claim                 '' or a periodic's name: store the jobs only if this call is the
--                         first to claim tick `claim_tick` of it (exactly once per tick)
-- A.claim_tick            the tick (ms) being claimed
-- A.claim_mode            'fire', or 'seen': only fire if the periodic has a tick claimed
--                         before (a first start records the tick in schedule_prefix
--                         instead of firing for the past; fired_prefix stays unset)
-- A.task                  task name of every job
-- A.priority              0-9
-- A.tenant                '' for none
-- A.delay_ms              '' or run no sooner than this long after now
-- A.at_ms                 '' or run no sooner than this epoch time (ms)
-- A.max_attempts          runs allowed in all
-- A.key                   '' or a dedupe key (batches of one job only)
-- A.visibility_ms         lease length
-- A.debounce_ms           '' or: with a key, run once this long after the latest enqueue
-- A.debounce_max_ms '' or: ... but no later than this long after the first one
-- A.throttle_ms           '' or: with a key, the key stays taken this long from the first
-- A.trace                 '' or the trace id (32 hex chars) of the call, for the sink
-- A.parent                '' or the id of the job that waits for this one (ctx.child):
--                         one job, never stored over a record that exists
-- A.expires               '' or when the jobs must start by: '+<ms>' from now, or '<ms>'
-- A.deadline              ... and finish by (include/expiry.lua); the same forms
-- A.dead_cap              most dead letters kept (a hand-off may meet a bad record)
-- A.events_maxlen         approximate cap of the events stream
-- A.jobs                  number of jobs that follow, 2 fields each: short id, args
-- Returns: the number of jobs stored (all of them); or, when a held dedupe key or a taken
--          claim stops it, a list: { short id of the job holding the key, 0 } or {}
--@include clock
--@include job_record
--@include ready
--@include counter
--@include metrics
--@include dedupe
--@include enqueue_checks
--@include enqueue_handoff

local job_prefix, delayed, counts, schedule_prefix = K.job_prefix, K.delayed, K.counts,
  K.schedule_prefix
local bucket_seconds, bucket_ttl = tonumber(A.bucket_seconds), tonumber(A.bucket_ttl)
local claim, claim_tick, claim_mode = A.claim, tonumber(A.claim_tick), A.claim_mode
local task, priority, tenant = A.task, tonumber(A.priority), A.tenant
local delay_ms, at_ms, max_attempts = A.delay_ms, A.at_ms, tonumber(A.max_attempts)
local key, visibility_ms = A.key, tonumber(A.visibility_ms)
local debounce_ms, debounce_max_ms = tonumber(A.debounce_ms), tonumber(A.debounce_max_ms)
local throttle_ms, trace, n_jobs = tonumber(A.throttle_ms), A.trace, tonumber(A.jobs)
local FIRST, FIELDS, ID, ARGS = ITEM.first, ITEM.fields, ITEM.short_id, ITEM.args

-- Validate everything before the first write: a script is never half-applied.
local problem = enqueue_problem()
if problem then return redis.error_reply('ERR enqueue: ' .. problem) end

if child_stored(job_prefix) then return { ARGV[FIRST + ID], 0 } end
if claim ~= '' and not claim_fires(schedule_prefix .. claim, claim_tick, claim_mode) then
  return {}
end

local now = now_ms(A.now)
if key ~= '' then
  local existing = dedupe_existing(K, { key = key, args = ARGV[FIRST + ARGS], now = now,
    debounce_ms = debounce_ms, throttle = throttle_ms ~= nil })
  if existing then return { existing, 0 } end
end

local due = now
if delay_ms ~= '' then due = now + tonumber(delay_ms) end
if debounce_ms then due = now + debounce_ms end
if at_ms ~= '' and tonumber(at_ms) > due then due = tonumber(at_ms) end
local scheduled = due > now
local state = scheduled and 'scheduled' or 'ready'
-- Only what differs from the defaults is stored (include/job_record.lua): a queued job
-- costs less memory. Readers take absent attempts as 0, tenant as none, run_at as 'e'.
local record = { 't', task, 's', state, 'e', string.format('%d', now) }
if A.priority ~= DEFAULT_PRIORITY then
  record[#record + 1] = 'p'; record[#record + 1] = A.priority
end
if max_attempts ~= DEFAULT_MAX_ATTEMPTS then
  record[#record + 1] = 'm'; record[#record + 1] = A.max_attempts
end
if visibility_ms ~= DEFAULT_VT then
  record[#record + 1] = 'v'; record[#record + 1] = A.visibility_ms
end
if tenant ~= '' then record[#record + 1] = 'tenant'; record[#record + 1] = tenant end
if scheduled then record[#record + 1] = 'run_at'; record[#record + 1] = seconds(due) end
if key ~= '' then record[#record + 1] = 'key'; record[#record + 1] = key end
local start_by = rarer_fields(record, now, debounce_max_ms, claim_tick)
local n_fields = #record

-- A key of the wrong type (one written over by hand) must not leave a call half applied:
-- a call that fails has stored no job, and a call that stored its jobs returns them (if it
-- failed, its caller would store them again). So the jobs are counted and listed first,
-- before their records exist (an id without a record is skipped where it is popped), and
-- the count is taken back when the listing fails; the metrics and the wake-up come last,
-- and a key of theirs that refuses is passed over (write_tally, wake_one, live_waiter).
local ids = {}
for i = 0, n_jobs - 1 do ids[i + 1] = ARGV[FIRST + i * FIELDS + ID] end
if n_jobs > 0 then
  if scheduled then
    for _, id in ipairs(ids) do redis.call('ZADD', delayed, due, id) end
  else
    add_count(counts, 'ready', n_jobs)
    local listed, refused = pcall(push_ready_many, K.ready_prefix, K.ring_prefix, K.priorities,
      ids, A.priority, tenant)
    if not listed then
      add_count(counts, 'ready', -n_jobs)
      return redis.error_reply(type(refused) == 'table' and refused.err or tostring(refused))
    end
  end
end
for i = 0, n_jobs - 1 do
  record[n_fields + 1], record[n_fields + 2] = 'a', ARGV[FIRST + i * FIELDS + ARGS]
  redis.call('HSET', job_prefix .. ids[i + 1], unpack(record))
end
if start_by then on_timer(K.expiring, start_by, ids) end
if key ~= '' then dedupe_created(K, key, ids[1], throttle_ms) end
-- What readers show as the periodic's last fire: only a tick that stored its job.
if claim ~= '' and n_jobs > 0 then
  redis.call('SET', K.fired_prefix .. claim, string.format('%d', claim_tick))
end

if n_jobs > 0 then
  local tally = new_tally()
  count(tally, task, 'enqueued', n_jobs)
  write_tally(tally, bucket_key(K.metrics_prefix, now, bucket_seconds), bucket_ttl)
  enqueue_hand_off(now, scheduled and 0 or n_jobs)  -- or wake a worker
end
return n_jobs
