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
