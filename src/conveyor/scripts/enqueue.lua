#!lua
-- Store a batch of new jobs and make them ready (or scheduled, when due later).
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
-- ARGV[1] now             '' for the server clock (ms override, tests only)
-- ARGV[2] bucket_seconds  width of a metric bucket
-- ARGV[3] bucket_ttl      lifetime of a metric bucket (s)
-- ARGV[4] claim           '' or a periodic's name: store the jobs only if this call is the
--                         first to claim tick `claim_tick` of it (exactly once per tick)
-- ARGV[5] claim_tick      the tick (ms) being claimed
-- ARGV[6] claim_mode      'fire', or 'seen': only fire if the periodic has fired before
--                         (a first start records the tick instead of firing for the past)
-- ARGV[7] count           number of jobs that follow, 10 fields each:
--         id, task, args, priority (0-9), tenant, delay_ms ('' = none),
--         at_ms ('' = none), max_attempts, key ('' = none), visibility_ms (lease length)
-- Returns: flat list, per job: short id (an existing one when its key is held), created 0|1;
--          empty when a claim was already taken
--@include clock
--@include ready
--@include metrics

local job_prefix, ready_prefix, ring_prefix = KEYS[1], KEYS[2], KEYS[3]
local priorities, delayed, counts = KEYS[4], KEYS[5], KEYS[6]
local dedupe_prefix, wake, metrics_prefix, schedule_prefix = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local bucket_seconds, bucket_ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local claim, claim_tick, claim_mode = ARGV[4], tonumber(ARGV[5]), ARGV[6]
local n_jobs = tonumber(ARGV[7])
local FIELDS, FIRST = 10, 8

-- Validate everything before the first write: a script is never half-applied.
if not n_jobs or #ARGV ~= FIRST - 1 + n_jobs * FIELDS then
  return redis.error_reply('ERR enqueue: expected ' .. tostring(n_jobs) .. ' jobs of '
    .. FIELDS .. ' fields, got ' .. (#ARGV - FIRST + 1) .. ' values')
end
for i = 0, n_jobs - 1 do
  local base = FIRST + i * FIELDS
  local p = tonumber(ARGV[base + 3])
  if ARGV[base] == '' or ARGV[base + 1] == '' then
    return redis.error_reply('ERR enqueue: job ' .. i .. ' has no id or task')
  end
  if not p or p ~= math.floor(p) or p < 0 or p > 9 then
    return redis.error_reply('ERR enqueue: priority must be an integer 0-9, got ' .. ARGV[base + 3])
  end
  if not tonumber(ARGV[base + 7]) or tonumber(ARGV[base + 7]) < 1 then
    return redis.error_reply('ERR enqueue: max_attempts must be >= 1')
  end
  if not tonumber(ARGV[base + 9]) or tonumber(ARGV[base + 9]) <= 0 then
    return redis.error_reply('ERR enqueue: visibility_ms must be > 0')
  end
end

if claim ~= '' then
  if not claim_tick then return redis.error_reply('ERR enqueue: claim_tick must be a number') end
  local last = tonumber(redis.call('GET', schedule_prefix .. claim))
  if last and last >= claim_tick then return {} end
  redis.call('SET', schedule_prefix .. claim, string.format('%d', claim_tick))
  if not last and claim_mode == 'seen' then return {} end
end

local now = now_ms(ARGV[1])
local now_s = seconds(now)
local out, made_ready, enqueued = {}, 0, {}
for i = 0, n_jobs - 1 do
  local base = FIRST + i * FIELDS
  local id, task, args = ARGV[base], ARGV[base + 1], ARGV[base + 2]
  local priority, tenant = ARGV[base + 3], ARGV[base + 4]
  local delay_ms, at_ms, key = ARGV[base + 5], ARGV[base + 6], ARGV[base + 8]
  local existing = nil
  if key ~= '' then
    existing = redis.call('GET', dedupe_prefix .. key)
    if existing and redis.call('EXISTS', job_prefix .. existing) == 0 then existing = nil end
  end
  if existing then
    out[#out + 1] = existing
    out[#out + 1] = 0
  else
    local due = now
    if delay_ms ~= '' then due = now + tonumber(delay_ms) end
    if at_ms ~= '' and tonumber(at_ms) > due then due = tonumber(at_ms) end
    local state = 'ready'
    if due > now then state = 'scheduled' end
    redis.call('HSET', job_prefix .. id, 'task', task, 'args', args, 'state', state,
      'priority', priority, 'tenant', tenant, 'attempts', 0, 'max_attempts', ARGV[base + 7],
      'enqueued_at', now_s, 'run_at', seconds(due), 'vt', ARGV[base + 9], 'key', key)
    if claim ~= '' then redis.call('HSET', job_prefix .. id, 'tick', seconds(claim_tick)) end
    if key ~= '' then redis.call('SET', dedupe_prefix .. key, id) end
    if state == 'scheduled' then
      redis.call('ZADD', delayed, due, id)
    else
      push_ready(ready_prefix, ring_prefix, priorities, id, priority, tenant, false)
      made_ready = made_ready + 1
    end
    enqueued[task] = (enqueued[task] or 0) + 1
    out[#out + 1] = id
    out[#out + 1] = 1
  end
end

if made_ready > 0 then
  redis.call('HINCRBY', counts, 'ready', made_ready)
end
if next(enqueued) ~= nil then
  local tally = new_tally()
  for task, n in pairs(enqueued) do count(tally, task, 'enqueued', n) end
  write_tally(tally, bucket_key(metrics_prefix, now, bucket_seconds), bucket_ttl)
  wake_one(wake)
end
return out
