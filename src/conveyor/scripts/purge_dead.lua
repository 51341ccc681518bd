#!lua flags=allow-oom
--!df flags=allow-undeclared-keys
-- Delete up to `limit` dead jobs, oldest first (the caller repeats until it returns 0).
-- It only removes, so it may run while Redis is out of memory: purging dead letters is
-- one way an operator frees memory in an out-of-memory spell.
--
-- K.job_prefix
-- K.dead
-- A.limit         most jobs to delete in this call
-- Returns: number of jobs deleted
local job_prefix, dead = K.job_prefix, K.dead
local limit = tonumber(A.limit)
if not limit or limit < 1 then return redis.error_reply('ERR purge_dead: limit must be >= 1') end

local ids = redis.call('ZRANGE', dead, 0, limit - 1)
for _, id in ipairs(ids) do redis.call('DEL', job_prefix .. id) end
if #ids > 0 then redis.call('ZREMRANGEBYRANK', dead, 0, #ids - 1) end
return #ids
