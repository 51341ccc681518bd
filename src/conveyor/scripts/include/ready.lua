-- Ready jobs: one list per (priority, tenant); a ring of tenants per priority that have
-- ready jobs; a zset of priorities that have a ring. A tenant is in its ring exactly
-- while its list is non-empty, so popping is O(1) in tenants and jobs.
--
-- A plain single enqueue (conveyor/scripts/plain.py) runs no script: it stores the record
-- and appends '<id>' (default priority) or '<id>|<priority>' to the queue's inbox, a list
-- at ready_prefix .. 'in', in one MULTI. The inbox holds jobs without a tenant only, and
-- its jobs are counted ready. Before ready jobs are claimed, absorb_inbox moves them onto
-- their priority's list; while the inbox is not empty, jobs without a tenant that join the
-- back of a list go to the inbox too, so the order within a priority stays the enqueue order.
--
-- A ready list or the inbox that holds another type (written over by hand) is set aside
-- where a script meets it, and serves again from empty (list_call, key_types.lua): a claim
-- never stops half way on it. The ids it held are gone with what was written over them. A
-- tenant that was in its ring when its list was set aside may be named there twice until
-- its list is next empty, so it gets an extra turn meanwhile.
--@include job_record
--@include counter
--@include key_types

local INBOX_SUFFIX = 'in'  -- keep in step with conveyor.keys.QueueKeys.inbox
local ABSORB_LIMIT = 10000  -- inbox entries moved per call: a huge inbox empties over calls

local function inbox_entry(id, priority)
  if priority == DEFAULT_PRIORITY then return id end
  return id .. '|' .. priority
end

-- Append (or, for jobs that have already waited, prepend) a job to its tenant's list.
local function push_ready(ready_prefix, ring_prefix, priorities, id, priority, tenant, front)
  local inbox = ready_prefix .. INBOX_SUFFIX
  if not front and tenant == '' and list_call('LLEN', inbox) > 0 then
    list_call('RPUSH', inbox, inbox_entry(id, priority))
    return
  end
  local list = ready_prefix .. priority .. ':' .. tenant
  local n = list_call(front and 'LPUSH' or 'RPUSH', list, id)
  if n == 1 then
    redis.call('RPUSH', ring_prefix .. priority, tenant)
    redis.call('ZADD', priorities, priority, priority)
  end
end

-- Append a batch of jobs of one priority and tenant to their list (one RPUSH per thousand).
-- The ring and the priorities are written before the list: should one of them refuse (a
-- key of the wrong type), no job is listed where no pop would reach it (a tenant in its
-- ring with an empty list is dropped by the next pop).
local function list_ready_many(ready_prefix, ring_prefix, priorities, ids, priority, tenant)
  if #ids == 0 then return end
  local list = ready_prefix .. priority .. ':' .. tenant
  if list_call('LLEN', list) == 0 then  -- the list is empty: its tenant joins the ring
    redis.call('RPUSH', ring_prefix .. priority, tenant)
    redis.call('ZADD', priorities, priority, priority)
  end
  for i = 1, #ids, 1000 do
    list_call('RPUSH', list, unpack(ids, i, math.min(i + 999, #ids)))
  end
end

-- Append a batch of jobs of one priority and tenant: to their list, or behind the inbox's.
local function push_ready_many(ready_prefix, ring_prefix, priorities, ids, priority, tenant)
  local inbox = ready_prefix .. INBOX_SUFFIX
  if tenant == '' and #ids > 0 and list_call('LLEN', inbox) > 0 then
    local entries = {}
    for i, id in ipairs(ids) do entries[i] = inbox_entry(id, priority) end
    for i = 1, #entries, 1000 do
      list_call('RPUSH', inbox, unpack(entries, i, math.min(i + 999, #entries)))
    end
    return
  end
  list_ready_many(ready_prefix, ring_prefix, priorities, ids, priority, tenant)
end

-- Move the inbox's jobs (up to ABSORB_LIMIT) onto their priorities' lists, in order. An
-- entry without a readable priority goes to the default one whole: an id that names no
-- record is skipped when it is popped, as any stray entry of a ready list.
local function absorb_inbox(ready_prefix, ring_prefix, priorities)
  local entries = list_call('LPOP', ready_prefix .. INBOX_SUFFIX, ABSORB_LIMIT)
  if not entries then return end
  local run, level = {}, nil
  for _, entry in ipairs(entries) do
    local id, priority = string.match(entry, '^(.+)|(%d)$')
    if not id then id, priority = entry, DEFAULT_PRIORITY end
    if priority ~= level then
      if #run > 0 then list_ready_many(ready_prefix, ring_prefix, priorities, run, level, '') end
      run, level = {}, priority
    end
    run[#run + 1] = id
  end
  list_ready_many(ready_prefix, ring_prefix, priorities, run, level, '')
end

-- Take the next job id: highest priority first, tenants round robin within it.
-- Returns the id, or nil when nothing is ready.
local function pop_ready(ready_prefix, ring_prefix, priorities)
  while true do
    local top = redis.call('ZRANGE', priorities, 0, 0, 'REV')
    if #top == 0 then return nil end
    local ring = ring_prefix .. top[1]
    local tenant = redis.call('LPOP', ring)
    if not tenant then
      redis.call('ZREM', priorities, top[1])
    else
      local list = ready_prefix .. top[1] .. ':' .. tenant
      local id = list_call('LPOP', list)
      if list_call('LLEN', list) > 0 then
        redis.call('RPUSH', ring, tenant)
      elseif redis.call('LLEN', ring) == 0 then
        redis.call('ZREM', priorities, top[1])
      end
      if id then return id end
    end
  end
end

-- Take up to `want` job ids: highest priority first; within a priority, tenants take turns,
-- except that a tenant alone at its level gives a run of its jobs in one command (there is
-- nobody to be fair to, and the next fetch serves any tenant that arrives meanwhile).
local function pop_ready_many(ready_prefix, ring_prefix, priorities, want)
  local out = {}
  while #out < want do
    local top = redis.call('ZRANGE', priorities, 0, 0, 'REV')
    if #top == 0 then break end
    local ring = ring_prefix .. top[1]
    local tenants = redis.call('LLEN', ring)
    if tenants == 0 then
      redis.call('ZREM', priorities, top[1])
    elseif tenants == 1 then
      local tenant = redis.call('LINDEX', ring, 0)
      local list = ready_prefix .. top[1] .. ':' .. tenant
      local ids = list_call('LPOP', list, want - #out)
      if ids then
        for _, id in ipairs(ids) do out[#out + 1] = id end
      end
      if list_call('LLEN', list) == 0 then
        redis.call('DEL', ring)
        redis.call('ZREM', priorities, top[1])
      end
    else
      for _ = 1, math.min(tenants, want - #out) do
        local id = pop_ready(ready_prefix, ring_prefix, priorities)
        if not id then break end
        out[#out + 1] = id
      end
    end
  end
  return out
end

-- Tell one idle worker that there may be work; the list never holds more than one marker.
-- A wake key of the wrong type wakes nobody rather than fail the call that made the work:
-- idle workers also look for work after each quiet spell.
local function wake_one(wake)
  if redis.pcall('LLEN', wake) == 0 then redis.call('LPUSH', wake, '1') end
end

-- Count jobs just made ready and wake a worker for them.
local function made_ready(counts, wake, n)
  if n > 0 then
    add_count(counts, 'ready', n)
    wake_one(wake)
  end
end
