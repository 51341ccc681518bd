#!lua
-- Store a batch of new jobs of one task with the same options, and make them ready (or
-- scheduled, when due later). Options are sent once per batch, not once per job.
--
-- KEYS[1] job_prefix      job record hashes: job_prefix .. short id
-- KEYS[2] ready_prefix    ready lists: ready_prefix .. priority .. ':' .. tenant
-- KEYS[3] ring_prefix     tenant rings: ring_prefix .. priority
-- KEYS[4] priorities      zset of priorities with ready jobs
-- KEYS[5] delayed         zset short id -> due time (ms)
-- KEYS[6] counts          hash: ready
-- KEYS[7] dedupe_prefix   dedupe keys: dedupe_prefix .. key -> short id
-- KEYS[8] wake            wake marker list
-- KEYS[9] metrics_prefix  metric buckets
-- KEYS[10] schedule_prefix last fired tick per periodic: schedule_prefix .. name -> ms
-- KEYS[11] throttle_prefix throttle windows: throttle_prefix .. key -> short id (expires)
-- KEYS[12] leases
-- KEYS[13] dead
-- KEYS[14] active
-- KEYS[15] seq
-- KEYS[16] events
-- KEYS[17] paused
-- KEYS[18] limits
-- KEYS[19] buckets
-- KEYS[20] running
-- KEYS[21] parked
-- KEYS[22] waiters
-- KEYS[23] waiter_offers
-- KEYS[24] handoff_prefix
-- ARGV[1] now             '' for the server clock (ms override, tests only)
-- ARGV[2] bucket_seconds  width of a metric bucket
-- ARGV[3] bucket_ttl      lifetime of a metric bucket (s)
-- ARGV[4] claim           '' or a periodic's name: store the jobs only if this call is the
--                         first to claim tick `claim_tick` of it (exactly once per tick)
-- ARGV[5] claim_tick      the tick (ms) being claimed
-- ARGV[6] claim_mode      'fire', or 'seen': only fire if the periodic has fired before
--                         (a first start records the tick instead of firing for the past)
-- ARGV[7] task            task name of every job
-- ARGV[8] priority        0-9
-- ARGV[9] tenant          '' for none
-- ARGV[10] delay_ms       '' or run no sooner than this long after now
-- ARGV[11] at_ms          '' or run no sooner than this epoch time (ms)
-- ARGV[12] max_attempts   runs allowed in all
-- ARGV[13] key            '' or a dedupe key (batches of one job only)
-- ARGV[14] visibility_ms  lease length
-- ARGV[15] debounce_ms    '' or: with a key, run once this long after the latest enqueue
-- ARGV[16] debounce_max_ms '' or: ... but no later than this long after the first one
-- ARGV[17] throttle_ms    '' or: with a key, the key stays taken this long from the first
-- ARGV[18] trace          '' or the trace id (32 hex chars) of the call, for the sink
-- ARGV[19] dead_cap       most dead letters kept (a hand-off may meet a bad record)
-- ARGV[20] events_maxlen  approximate cap of the events stream
-- ARGV[21] jobs           number of jobs that follow, 2 fields each: short id, args
-- Returns: the number of jobs stored (all of them); or, when a held dedupe key or a taken
--          claim stops it, a list: { short id of the job holding the key, 0 } or {}
--@include clock
--@include job_record
--@include ready
--@include counter
--@include metrics
--@include keyed
--@include enqueue_checks
--@include handoff

local job_prefix, ready_prefix, ring_prefix = KEYS[1], KEYS[2], KEYS[3]
local priorities, delayed, counts = KEYS[4], KEYS[5], KEYS[6]
local dedupe_prefix, wake, metrics_prefix, schedule_prefix = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local bucket_seconds, bucket_ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local claim, claim_tick, claim_mode = ARGV[4], tonumber(ARGV[5]), ARGV[6]
local task, priority, tenant = ARGV[7], tonumber(ARGV[8]), ARGV[9]
local delay_ms, at_ms, max_attempts = ARGV[10], ARGV[11], tonumber(ARGV[12])
local key, visibility_ms = ARGV[13], tonumber(ARGV[14])
local debounce_ms, debounce_max_ms = tonumber(ARGV[15]), tonumber(ARGV[16])
local throttle_ms, trace, n_jobs = tonumber(ARGV[17]), ARGV[18], tonumber(ARGV[21])
local FIRST = 22

-- Validate everything before the first write: a script is never half-applied.
local problem = enqueue_problem(FIRST)
if problem then return redis.error_reply('ERR enqueue: ' .. problem) end

if claim ~= '' then
  local last = tonumber(redis.call('GET', schedule_prefix .. claim))
  if last and last >= claim_tick then return {} end
  redis.call('SET', schedule_prefix .. claim, string.format('%d', claim_tick))
  if not last and claim_mode == 'seen' then return {} end
end

local now = now_ms(ARGV[1])
if key ~= '' then
  local existing = keyed_existing({ job_prefix = job_prefix, dedupe_prefix = dedupe_prefix,
    throttle_prefix = KEYS[11], delayed = delayed }, { key = key, args = ARGV[FIRST + 1],
    now = now, debounce_ms = debounce_ms, throttle = throttle_ms ~= nil })
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
if ARGV[8] ~= DEFAULT_PRIORITY then record[#record + 1] = 'p'; record[#record + 1] = ARGV[8] end
if max_attempts ~= DEFAULT_MAX_ATTEMPTS then
  record[#record + 1] = 'm'; record[#record + 1] = ARGV[12]
end
if visibility_ms ~= DEFAULT_VT then record[#record + 1] = 'v'; record[#record + 1] = ARGV[14] end
if tenant ~= '' then record[#record + 1] = 'tenant'; record[#record + 1] = tenant end
if scheduled then record[#record + 1] = 'run_at'; record[#record + 1] = seconds(due) end
if key ~= '' then record[#record + 1] = 'key'; record[#record + 1] = key end
if debounce_max_ms then
  record[#record + 1] = 'debounce_until'
  record[#record + 1] = string.format('%.3f', now + debounce_max_ms)
end
if claim ~= '' then record[#record + 1] = 'tick'; record[#record + 1] = seconds(claim_tick) end
if trace ~= '' then record[#record + 1] = 'tr'; record[#record + 1] = trace end
local n_fields = #record

-- A key of the wrong type (one written over by hand) must not leave a call half applied:
-- a call that fails has stored no job, and a call that stored its jobs returns them (if it
-- failed, its caller would store them again). So the jobs are counted and listed first,
-- before their records exist (an id without a record is skipped where it is popped), and
-- the count is taken back when the listing fails; the metrics and the wake-up come last,
-- and a key of theirs that refuses is passed over (write_tally, wake_one, live_waiter).
local ids = {}
for i = 0, n_jobs - 1 do ids[i + 1] = ARGV[FIRST + i * 2] end
if n_jobs > 0 then
  if scheduled then
    for _, id in ipairs(ids) do redis.call('ZADD', delayed, due, id) end
  else
    add_count(counts, 'ready', n_jobs)
    local listed, refused = pcall(push_ready_many, ready_prefix, ring_prefix, priorities, ids,
      ARGV[8], tenant)
    if not listed then
      add_count(counts, 'ready', -n_jobs)
      return redis.error_reply(type(refused) == 'table' and refused.err or tostring(refused))
    end
  end
end
for i = 0, n_jobs - 1 do
  record[n_fields + 1], record[n_fields + 2] = 'a', ARGV[FIRST + i * 2 + 1]
  redis.call('HSET', job_prefix .. ids[i + 1], unpack(record))
end
if key ~= '' then
  keyed_created({ dedupe_prefix = dedupe_prefix, throttle_prefix = KEYS[11] }, key, ids[1],
    throttle_ms)
end

if n_jobs > 0 then
  local tally = new_tally()
  count(tally, task, 'enqueued', n_jobs)
  write_tally(tally, bucket_key(metrics_prefix, now, bucket_seconds), bucket_ttl)
  enqueue_hand_off(now, scheduled and 0 or n_jobs)  -- or wake a worker
end
return n_jobs
