#!lua
--!df flags=allow-undeclared-keys
-- Record the result of a named step of a running job, so that a later attempt gets it back
-- instead of running the step again. Only the holder of the current lease may record, and
-- not once the job is being cancelled. The first recorded result of a step is kept.
--
-- K.job_prefix
-- A.id            short id of the job
-- A.token         the lease's fencing token
-- A.name          the step's name
-- A.value         the step's encoded result
-- Returns: { code, recorded value }: 1 recorded; 2 already recorded (the value kept is
--          returned); 0 refused, the lease was lost; 3 refused, the job is being cancelled

local id, token, name, value = A.id, A.token, A.name, A.value
if not id or id == '' or not token or token == '' or not name or name == ''
    or #name > 200 or not value then
  return redis.error_reply('ERR step: id, token and a name of 1-200 bytes must be set')
end

local key = K.job_prefix .. id
local f = redis.pcall('HMGET', key, 's', 'token', 'cancel', 'step:' .. name)  -- no hash: refused
if f[1] ~= 'active' or f[2] ~= token then return { 0, '' } end
if f[3] then return { 3, '' } end
if f[4] then return { 2, f[4] } end
redis.call('HSET', key, 'step:' .. name, value)
return { 1, '' }
