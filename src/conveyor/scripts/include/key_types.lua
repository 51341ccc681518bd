-- A queue key written over by hand (a string where a sorted set belongs, say) fails the
-- first command of a script that touches it, and Redis keeps every write the script made
-- before that: a fetch would have popped and leased jobs that no lease set names, a finish
-- settled records whose counts it never took off. So a script that writes several of a
-- queue's fixed keys first checks their types, and refuses, having changed nothing, with
-- an error naming the key; its caller retries until the key is repaired.

-- The first of `checks` (flat: key, type, key, type, ...) that holds another type than
-- the one named (a missing key is fine), as an error text naming `script` and the key;
-- nil when every key is of its type.
local function wrong_key_type(script, checks)
  for i = 1, #checks, 2 do
    local kind = redis.call('TYPE', checks[i]).ok
    if kind ~= 'none' and kind ~= checks[i + 1] then
      return 'WRONGTYPE ' .. script .. ': key ' .. checks[i] .. ' holds a ' .. kind
        .. ' where a ' .. checks[i + 1] .. ' belongs (written over by hand?); nothing was'
        .. ' changed'
    end
  end
  return nil
end

-- The value of a counter key (a string INCRBY adds to) when it is not an integer, else
-- nil: INCRBY would fail on it, part way through the call that increments it.
local function not_a_counter(key)
  local value = redis.call('GET', key)
  if value and not string.match(value, '^%-?%d+$') then return value end
  return nil
end

-- Keys named per job or per tenant (a job's record, a tenant's ready list) cannot be
-- checked before the first write: which of them a call meets is known only as it goes
-- (the jobs it pops), and a TYPE per job would cost every call. So a script reads them
-- with redis.pcall, and one that holds another type is moved aside, to the name `set_aside`
-- gives, kept a week for whoever wants to see what was written there. A job whose record
-- was moved aside is dead-lettered with the reason (records.lua); a ready list moved aside
-- starts again empty (list_call). Every job the call meets goes on as it would have.
local SET_ASIDE_SECONDS = 7 * 86400

-- Move `key` to its queue's hash tag .. ':mangled' .. the rest of its name (the same slot),
-- for SET_ASIDE_SECONDS; returns that name.
local function set_aside(key)
  local tag = string.match(key, '^{[^}]*}') or ''
  local aside = tag .. ':mangled' .. string.sub(key, #tag + 1)
  redis.call('RENAME', key, aside)
  redis.call('EXPIRE', aside, SET_ASIDE_SECONDS)
  return aside
end

-- redis.call(command, key, ...) on a key that must be a list (a ready list, the inbox): one
-- of another type is set aside first, and the command runs on the list as if empty.
local function list_call(command, key, ...)
  local reply = redis.pcall(command, key, ...)
  if type(reply) == 'table' and reply.err then
    if string.sub(reply.err, 1, 9) ~= 'WRONGTYPE' then error(reply) end
    set_aside(key)
    reply = redis.call(command, key, ...)
  end
  return reply
end
