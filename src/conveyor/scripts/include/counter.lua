-- Counts (a queue's ready, running and handed jobs, its active jobs per task and running
-- jobs per tenant, a record's snoozes and interruptions) are kept with HINCRBY, which
-- fails on a field that is not an integer (changed by hand): the script would stop after
-- its first writes. Such a count reads as 0 everywhere, and starts again from 0 here.

-- HINCRBY hash field by, surviving a mangled field. Returns the new count; after a mangled
-- field that is `by` itself (a caller that takes a count below 0 as a sign that it needs a
-- recount still sees it), and what is stored is never below 0. (A key of the wrong type
-- still fails the call: a script with writes before its counts checks types first.)
local function add_count(hash, field, by)
  local n = redis.pcall('HINCRBY', hash, field, by)
  if type(n) == 'number' then return n end
  redis.call('HSET', hash, field, math.max(by, 0))
  return by
end
