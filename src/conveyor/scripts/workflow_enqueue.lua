#!lua
-- Store the nodes of one workflow that live in this queue, and, in the workflow's home
-- queue, the workflow's record. Nodes without parents are made ready (or scheduled, when
-- due later) at once; the others wait (see include/workflow.lua). A workflow spanning
-- several queues is stored by one call per queue, home queue first; a parent in another
-- queue may end before this call runs: its hand-over was then kept in the node's waiting
-- hash, and the node is settled here as it is stored.
--
-- KEYS[1]  job_prefix
-- KEYS[2]  ready_prefix
-- KEYS[3]  ring_prefix
-- KEYS[4]  priorities
-- KEYS[5]  delayed
-- KEYS[6]  counts
-- KEYS[7]  wake
-- KEYS[8]  metrics_prefix
-- KEYS[9]  handover
-- KEYS[10] waiting_prefix
-- KEYS[11] workflow_prefix
-- ARGV[1] now             '' for the server clock (ms override, tests only)
-- ARGV[2] bucket_seconds  width of a metric bucket
-- ARGV[3] bucket_ttl      lifetime of a metric bucket (s)
-- ARGV[4] retention       seconds a cancelled record is kept
-- ARGV[5] workflow        public id of the workflow (stored on every node)
-- ARGV[6] home            '' or the workflow's short id: store its record in this queue
-- ARGV[7] nodes           the workflow's node list (encoded; read by Python only)
-- ARGV[8] total           number of nodes in the whole workflow
-- ARGV[9] node_count      number of nodes that follow, 14 fields each: short id, task,
--         priority, tenant, delay_ms, at_ms, max_attempts, visibility_ms, args, name,
--         parents to wait for, run_if ('succeeded' | 'finished'), parents, children
--         (both encoded, read by Python only)
-- Returns: the number of nodes stored
--@include job_record
--@include clock
--@include ready
--@include metrics
--@include workflow
--@include key_types

local k = { job_prefix = KEYS[1], ready_prefix = KEYS[2], ring_prefix = KEYS[3],
  priorities = KEYS[4], delayed = KEYS[5], counts = KEYS[6], wake = KEYS[7],
  metrics_prefix = KEYS[8], handover = KEYS[9], waiting_prefix = KEYS[10],
  workflow_prefix = KEYS[11] }
local bucket_seconds, bucket_ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local retention, workflow, home = tonumber(ARGV[4]), ARGV[5], ARGV[6]
local total, n = tonumber(ARGV[8]), tonumber(ARGV[9])
local FIELDS, FIRST = 14, 10

local function invalid(message)
  return redis.error_reply('ERR workflow_enqueue: ' .. message)
end
if not (bucket_seconds and bucket_ttl and retention and total and n)
    or #ARGV ~= FIRST - 1 + n * FIELDS then
  return invalid('expected numeric settings and ' .. tostring(n) .. ' nodes of ' .. FIELDS
    .. ' fields')
end
if workflow == '' then return invalid('workflow id must not be empty') end
for i = 0, n - 1 do
  local b = FIRST + i * FIELDS
  local p, attempts, vt = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
  local need = tonumber(ARGV[b + 10])
  if ARGV[b] == '' or ARGV[b + 1] == '' then return invalid('node ' .. i .. ' has no id or task') end
  if not p or p ~= math.floor(p) or p < 0 or p > 9 then
    return invalid('node ' .. i .. ': priority must be an integer 0-9')
  end
  if not attempts or attempts < 1 or not vt or vt <= 0 or not need or need < 0 then
    return invalid('node ' .. i .. ': max_attempts, visibility_ms and parents must be numbers')
  end
  if (ARGV[b + 4] ~= '' and not tonumber(ARGV[b + 4]))
      or (ARGV[b + 5] ~= '' and not tonumber(ARGV[b + 5])) then
    return invalid('node ' .. i .. ': delay_ms and at_ms must be numbers or empty')
  end
  if ARGV[b + 11] ~= 'succeeded' and ARGV[b + 11] ~= 'finished' then
    return invalid('node ' .. i .. ": run_if must be 'succeeded' or 'finished'")
  end
end
local wrong = wrong_key_type('workflow_enqueue', { k.priorities, 'zset', k.delayed, 'zset',
  k.counts, 'hash', k.handover, 'list' })
if wrong then return redis.error_reply(wrong) end

local now = now_ms(ARGV[1])
local now_s = seconds(now)
if home ~= '' then
  redis.call('HSET', k.workflow_prefix .. home, 'nodes', ARGV[7], 'total', ARGV[8],
    'created_at', now_s)
end
local tally, ready, settle = new_tally(), 0, {}
for i = 0, n - 1 do
  local b = FIRST + i * FIELDS
  local id, task, priority, tenant = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local delay_ms, at_ms, need = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), tonumber(ARGV[b + 10])
  local record = { 't', task, 'e', string.format('%d', now), 'a', ARGV[b + 8], 'wf', workflow,
    'wfn', ARGV[b + 9] }
  local function put(field, value) record[#record + 1] = field; record[#record + 1] = value end
  if priority ~= DEFAULT_PRIORITY then put('p', priority) end
  if tonumber(ARGV[b + 6]) ~= DEFAULT_MAX_ATTEMPTS then put('m', ARGV[b + 6]) end
  if tonumber(ARGV[b + 7]) ~= DEFAULT_VT then put('v', ARGV[b + 7]) end
  if tenant ~= '' then put('tenant', tenant) end
  if ARGV[b + 11] == 'finished' then put('wfr', 'finished') end
  if ARGV[b + 12] ~= '' then put('wfp', ARGV[b + 12]) end
  if ARGV[b + 13] ~= '' then put('wfc', ARGV[b + 13]) end
  if need > 0 then
    -- Waiting: its delay counts from when its parents are done, its at= time stands.
    put('s', 'scheduled')
    put('wfw', ARGV[b + 10])
    if delay_ms then put('wfd', ARGV[b + 4]) end
    if at_ms then put('run_at', seconds(at_ms)) end
    redis.call('HSET', k.job_prefix .. id, unpack(record))
    if redis.call('EXISTS', k.waiting_prefix .. id) == 1 then settle[#settle + 1] = id end
  else
    local due = now + (delay_ms or 0)
    if at_ms and at_ms > due then due = at_ms end
    if due > now then
      put('s', 'scheduled')
      put('run_at', seconds(due))
      redis.call('HSET', k.job_prefix .. id, unpack(record))
      redis.call('ZADD', k.delayed, due, id)
    else
      put('s', 'ready')
      redis.call('HSET', k.job_prefix .. id, unpack(record))
      push_ready(k.ready_prefix, k.ring_prefix, k.priorities, id, priority, tenant, false)
      ready = ready + 1
    end
  end
  count(tally, task, 'enqueued', 1)
end
-- Parents in other queues that ended before this call: settle those nodes now.
for _, id in ipairs(settle) do
  redis.call('PERSIST', k.waiting_prefix .. id)
  if settle_waiting(k, id, nil, now, retention) == 'ready' then ready = ready + 1 end
end
made_ready(k.counts, k.wake, ready)
if n > 0 then write_tally(tally, bucket_key(k.metrics_prefix, now, bucket_seconds), bucket_ttl) end
return n
