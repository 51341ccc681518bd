-- The times a job must start and finish by (include/expiry.lua), from the arguments an
-- enqueue gets for them: '' none, '+<ms>' from now, '<ms>' an epoch time.

-- A write to an index a job's state does not depend on (the expiry timer, the suspended
-- set): one refused by a key of the wrong type (written over by hand) is passed over, so
-- the script goes on and its call costs no type check first. A job off its timer still
-- never starts past its time (the lease checks it), it only expires later than it should.
local function soft_call(...)
  return redis.pcall(...)
end

local function epoch_ms(raw, now)
  if raw == nil or raw == '' then return nil end
  if string.sub(raw, 1, 1) == '+' then return now + tonumber(string.sub(raw, 2)) end
  return tonumber(raw)
end

-- Whether an expires or deadline argument is one of those forms.
local function expiry_arg_ok(raw)
  return raw == '' or tonumber((string.gsub(raw, '^%+', ''))) ~= nil
end

-- Put 'x' (start by: the earlier of the two) and 'dl' (deadline) with put(field, value);
-- returns the start-by time (ms), or nil.
local function put_expiry(put, now, expires, deadline)
  local start_by, finish_by = epoch_ms(expires, now), epoch_ms(deadline, now)
  if finish_by and (not start_by or finish_by < start_by) then start_by = finish_by end
  if start_by then put('x', string.format('%d', start_by)) end
  if finish_by then put('dl', string.format('%d', finish_by)) end
  return start_by
end

-- Put `ids` on the expiry timer at `at` (ms): one ZADD per 500 jobs, not one per job.
local function on_timer(expiring, at, ids)
  local args = {}
  for i = 1, #ids do
    args[#args + 1], args[#args + 2] = at, ids[i]
    if #args >= 1000 or i == #ids then
      soft_call('ZADD', expiring, unpack(args))
      args = {}
    end
  end
end
