#!lua
--!df flags=allow-undeclared-keys
-- Note, in the workflow's home queue, which of its nodes have ended and been handed over.
-- Once all have, the workflow's record starts to expire with the retention of job records,
-- so a workflow costs memory only while it runs and for the retention after.
--
-- K.workflow_prefix        workflow records: workflow_prefix .. short id (+ ':ended')
-- A.retention              seconds the record is kept after the last node ended
-- A.workflow               short id of the workflow
-- A.ended                  number of node ids (public) that follow
-- Returns: how many nodes of the workflow have ended
local workflow_prefix = K.workflow_prefix
local retention, short, n = tonumber(A.retention), A.workflow, tonumber(A.ended)
if not retention or not short or short == '' or not n
    or #ARGV ~= ITEM.first - 1 + n * ITEM.fields then
  return redis.error_reply('ERR workflow_settle: expected retention, workflow and '
    .. tostring(n) .. ' node ids')
end
local record, ended = workflow_prefix .. short, workflow_prefix .. short .. ':ended'
for i = ITEM.first, #ARGV, 1000 do
  redis.call('SADD', ended, unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
local total = tonumber(redis.call('HGET', record, 'total'))
local count = redis.call('SCARD', ended)
if not total then
  redis.call('EXPIRE', ended, retention)  -- the record is gone: do not keep this for ever
elseif count >= total then
  redis.call('EXPIRE', record, retention)
  redis.call('EXPIRE', ended, retention)
end
return count
