-- Server time, in milliseconds as a float. A non-empty override pins it (tests only).
local function now_ms(override)
  if override ~= nil and override ~= '' then return tonumber(override) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end

-- Epoch seconds with microseconds, as stored on job records.
local function seconds(ms)
  return string.format('%.6f', ms / 1000)
end
