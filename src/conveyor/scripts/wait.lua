#!lua
--!df flags=allow-undeclared-keys
-- A running job reached a durable wait (a sleep, a wait for a signal, a child job): either
-- its outcome is known now, and is recorded as the wait's ('w:' .. name) and returned, or
-- the record says what the job waits for ('wt'), and the run ends suspended (its finish
-- suspends it). A wait that a run already described keeps its end in time: running the
-- task again (after a crash, or woken early) never pushes a sleep or a timeout further.
-- Only the holder of the current lease may do this, and not once the job is cancelling.
--
-- K.job_prefix
-- A.now        '' for the server clock (ms override, tests only)
-- A.id         short id of the job
-- A.token      the lease's fencing token
-- A.kind       'time' | 'signal' | 'child'
-- A.name       the wait's name (1-200 bytes)
-- A.ms         '' or the sleep's length / the wait's timeout (ms)
-- A.child      '' or the child job's id (planned by the caller, for kind 'child')
-- Returns: { code, value }: 1 the outcome is recorded (value: what was recorded); 2 the
--          job must suspend (value: the child id the wait names, '' for other kinds);
--          0 refused, the lease was lost; 3 refused, the job is being cancelled
--@include clock
--@include suspend

local id, token, kind, name = A.id, A.token, A.kind, A.name
local ms = A.ms ~= '' and tonumber(A.ms) or nil
if not id or id == '' or not token or token == '' or not WAIT_KINDS[kind] or not name
    or name == '' or #name > 200 or (A.ms ~= '' and not (ms and ms == ms and ms >= 0
      and ms < math.huge)) or (kind == 'time' and not ms) then
  return redis.error_reply('ERR wait: id, token, a known kind, a name of 1-200 bytes and a'
    .. ' length of 0 ms or more (for a sleep, always) must be set')
end

local key = K.job_prefix .. id
local f = redis.pcall('HMGET', key, 's', 'token', 'cancel', 'w:' .. name, 'wt', 'sig:' .. name)
if f[1] ~= 'active' or f[2] ~= token then return { 0, '' } end
if f[3] then return { 3, '' } end
if f[4] then return { 1, f[4] } end

local now = now_ms(A.now)
local function done(value)
  redis.call('HSET', key, 'w:' .. name, value)
  redis.call('HDEL', key, 'wt')
  return { 1, value }
end

if kind == 'signal' then
  local payload, rest = mailbox_pop(f[6])
  if payload then
    if rest then redis.call('HSET', key, 'sig:' .. name, rest)
    else redis.call('HDEL', key, 'sig:' .. name) end
    return done('s' .. payload)
  end
end
local w = parse_wait(f[5])
if w and w.name == name and w.kind == kind then
  if w.until_ms and now >= w.until_ms then return done(kind == 'time' and 't' or 'x') end
  return { 2, w.child or '' }
end
local until_ms = ms and now + ms or nil
-- Over the moment it is reached (a sleep of 0, a timeout of 0): recorded, no suspension.
if until_ms and until_ms <= now then return done(kind == 'time' and 't' or 'x') end
local child = kind == 'child' and A.child ~= '' and A.child or nil
redis.call('HSET', key, 'wt', wait_field(kind, until_ms, child, name))
return { 2, child or '' }
