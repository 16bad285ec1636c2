-- A group's lag (lag.lua's group_lag): the KEDA scaler's part of a backlog.
--
-- KEYS[1]  the stream
-- ARGV[1]  the group
-- ARGV[2]  LIMIT: the most entries counted one by one (XRANGE)
-- Returns the lag, or nil. Errors NOGROUP-like when the group is missing,
-- as XINFO GROUPS does when the stream is (`no such key`, WRONGTYPE).

local stream, group = KEYS[1], ARGV[1]
local info = find_group(redis.call('XINFO', 'GROUPS', stream), group)
if info == nil then
  return redis.error_reply('NOGROUP no group ' .. group .. ' on ' .. stream)
end
return group_lag(stream, info, tonumber(ARGV[2]))
