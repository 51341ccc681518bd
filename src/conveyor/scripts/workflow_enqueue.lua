#!lua
--!df flags=allow-undeclared-keys
-- Store the nodes of one workflow that live in this queue, and, in the workflow's home
-- queue, the workflow's record. Nodes without parents are made ready (or scheduled, when
-- due later) at once; the others wait (see include/workflow.lua). A workflow spanning
-- several queues is stored by one call per queue, home queue first; a parent in another
-- queue may end before this call runs: its hand-over was then kept in the node's waiting
-- hash, and the node is settled here as it is stored.
--
-- K.job_prefix
-- K.ready_prefix
-- K.ring_prefix
-- K.priorities
-- K.delayed
-- K.counts
-- K.wake
-- K.metrics_prefix
-- K.handover
-- K.waiting_prefix
-- K.workflow_prefix
-- K.expiring
-- A.now                   '' for the server clock (ms override, tests only)
-- A.bucket_seconds        width of a metric bucket
-- A.bucket_ttl            lifetime of a metric bucket (s)
-- A.retention             seconds a cancelled record is kept
-- A.workflow              public id of the workflow (stored on every node)
-- A.home                  '' or the workflow's short id: store its record in this queue
-- A.nodes                 the workflow's node list (encoded; read by Python only)
-- A.total                 number of nodes in the whole workflow
-- A.node_count            number of nodes that follow, 16 fields each: short id, task,
--         priority, tenant, delay_ms, at_ms, max_attempts, visibility_ms, args, name,
--         parents to wait for, run_if ('succeeded' | 'finished'), parents, children
--         (both encoded, read by Python only), expires, deadline (include/expiry_times)
-- Returns: the number of nodes stored
--@include job_record
--@include clock
--@include ready
--@include metrics
--@include expiry_times
--@include workflow
--@include key_types

local bucket_seconds, bucket_ttl = tonumber(A.bucket_seconds), tonumber(A.bucket_ttl)
local retention, workflow, home = tonumber(A.retention), A.workflow, A.home
local total, n = tonumber(A.total), tonumber(A.node_count)
local FIELDS, FIRST, NODE = ITEM.fields, ITEM.first, ITEM  -- NODE: a node's field offsets

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
  local p, attempts = tonumber(ARGV[b + NODE.priority]), tonumber(ARGV[b + NODE.max_attempts])
  local vt, need = tonumber(ARGV[b + NODE.visibility_ms]), tonumber(ARGV[b + NODE.waits_for])
  if ARGV[b + NODE.short_id] == '' or ARGV[b + NODE.task] == '' then
    return invalid('node ' .. i .. ' has no id or task')
  end
  if not p or p ~= math.floor(p) or p < 0 or p > 9 then
    return invalid('node ' .. i .. ': priority must be an integer 0-9')
  end
  if not attempts or attempts < 1 or not vt or vt <= 0 or not need or need < 0 then
    return invalid('node ' .. i .. ': max_attempts, visibility_ms and parents must be numbers')
  end
  local delay_ms, at_ms = ARGV[b + NODE.delay_ms], ARGV[b + NODE.at_ms]
  if (delay_ms ~= '' and not tonumber(delay_ms)) or (at_ms ~= '' and not tonumber(at_ms)) then
    return invalid('node ' .. i .. ': delay_ms and at_ms must be numbers or empty')
  end
  if ARGV[b + NODE.run_if] ~= 'succeeded' and ARGV[b + NODE.run_if] ~= 'finished' then
    return invalid('node ' .. i .. ": run_if must be 'succeeded' or 'finished'")
  end
end
local wrong = wrong_key_type('workflow_enqueue', { K.priorities, 'zset', K.delayed, 'zset',
  K.counts, 'hash', K.handover, 'list' })
if wrong then return redis.error_reply(wrong) end

local now = now_ms(A.now)
local now_s = seconds(now)
if home ~= '' then
  redis.call('HSET', K.workflow_prefix .. home, 'nodes', A.nodes, 'total', A.total,
    'created_at', now_s)
end
local tally, ready, settle = new_tally(), 0, {}
for i = 0, n - 1 do
  local b = FIRST + i * FIELDS
  local id, task = ARGV[b + NODE.short_id], ARGV[b + NODE.task]
  local priority, tenant = ARGV[b + NODE.priority], ARGV[b + NODE.tenant]
  local delay_ms, at_ms = tonumber(ARGV[b + NODE.delay_ms]), tonumber(ARGV[b + NODE.at_ms])
  local need = tonumber(ARGV[b + NODE.waits_for])
  local record = { 't', task, 'e', string.format('%d', now), 'a', ARGV[b + NODE.args],
    'wf', workflow, 'wfn', ARGV[b + NODE.name] }
  local function put(field, value) record[#record + 1] = field; record[#record + 1] = value end
  if priority ~= DEFAULT_PRIORITY then put('p', priority) end
  local max_attempts, vt = ARGV[b + NODE.max_attempts], ARGV[b + NODE.visibility_ms]
  if tonumber(max_attempts) ~= DEFAULT_MAX_ATTEMPTS then put('m', max_attempts) end
  if tonumber(vt) ~= DEFAULT_VT then put('v', vt) end
  if tenant ~= '' then put('tenant', tenant) end
  if ARGV[b + NODE.run_if] == 'finished' then put('wfr', 'finished') end
  if ARGV[b + NODE.parents] ~= '' then put('wfp', ARGV[b + NODE.parents]) end
  if ARGV[b + NODE.children] ~= '' then put('wfc', ARGV[b + NODE.children]) end
  local start_by = put_expiry(put, now, ARGV[b + NODE.expires], ARGV[b + NODE.deadline])
  if start_by then redis.call('ZADD', K.expiring, start_by, id) end
  if need > 0 then
    -- Waiting: its delay counts from when its parents are done, its at= time stands.
    put('s', 'scheduled')
    put('wfw', ARGV[b + NODE.waits_for])
    if delay_ms then put('wfd', ARGV[b + NODE.delay_ms]) end
    if at_ms then put('run_at', seconds(at_ms)) end
    redis.call('HSET', K.job_prefix .. id, unpack(record))
    if redis.call('EXISTS', K.waiting_prefix .. id) == 1 then settle[#settle + 1] = id end
  else
    local due = now + (delay_ms or 0)
    if at_ms and at_ms > due then due = at_ms end
    if due > now then
      put('s', 'scheduled')
      put('run_at', seconds(due))
      redis.call('HSET', K.job_prefix .. id, unpack(record))
      redis.call('ZADD', K.delayed, due, id)
    else
      put('s', 'ready')
      redis.call('HSET', K.job_prefix .. id, unpack(record))
      push_ready(K.ready_prefix, K.ring_prefix, K.priorities, id, priority, tenant, false)
      ready = ready + 1
    end
  end
  count(tally, task, 'enqueued', 1)
end
-- Parents in other queues that ended before this call: settle those nodes now.
for _, id in ipairs(settle) do
  redis.call('PERSIST', K.waiting_prefix .. id)
  if settle_waiting(K, id, nil, now, retention) == 'ready' then ready = ready + 1 end
end
made_ready(K.counts, K.wake, ready)
if n > 0 then write_tally(tally, bucket_key(K.metrics_prefix, now, bucket_seconds), bucket_ttl) end
return n
