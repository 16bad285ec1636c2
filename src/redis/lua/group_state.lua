-- A group's state and its stream's schedule, read in one step: what
-- DescribeGroup shows and the consume path polls into gauges, in one round
-- trip (a poll per subscription every --metrics-poll-interval-ms is most of
-- what an idle sidecar sends).
--
-- The two parts fail apart, as they did when they were separate commands: a
-- missing group still lets the gauges show the schedule. A part that failed
-- is Redis' error text in its place (a string, `<CODE> <message>`), not an
-- error reply, which would fail the whole reply.
--
-- KEYS[1]  the stream
-- KEYS[2]  its schedule (`<stream>:scheduled`, a sorted set; the stream's slot)
-- ARGV[1]  the group
-- ARGV[2]  SCAN: how many of the oldest pending entries to return
-- ARGV[3]  LIMIT: the most entries lag.lua's group_lag counts one by one
-- Returns { group, schedule }:
--   group     { the group's XINFO GROUPS fields (flat), XINFO CONSUMERS,
--             XPENDING (summary), XPENDING - + SCAN, XLEN, the lag or nil },
--             or the error: XINFO GROUPS' (`ERR no such key`, WRONGTYPE) or
--             NOGROUP when the stream has no such group
--   schedule  { ZCARD, the first entry's due time (its score, unix ms, as
--             text) or nil }, or ZCARD's error (WRONGTYPE)

local stream, schedule, group = KEYS[1], KEYS[2], ARGV[1]

local function group_part()
  -- Only XINFO GROUPS can fail: once it found the group, the commands after
  -- it see the same stream and group (a script runs alone).
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if groups['err'] then
    return groups['err']
  end
  local info, flat = find_group(groups, group)
  if info == nil then
    return 'NOGROUP no group ' .. group .. ' on ' .. stream
  end
  return {
    flat,
    redis.call('XINFO', 'CONSUMERS', stream, group),
    redis.call('XPENDING', stream, group),
    redis.call('XPENDING', stream, group, '-', '+', tonumber(ARGV[2])),
    redis.call('XLEN', stream),
    group_lag(stream, info, tonumber(ARGV[3])),
  }
end

local function schedule_part()
  local count = redis.pcall('ZCARD', schedule)
  if type(count) == 'table' then
    return count['err']
  end
  local first = false
  if count > 0 then
    first = redis.call('ZRANGE', schedule, 0, 0, 'WITHSCORES')[2]
  end
  return { count, first }
end

return { group_part(), schedule_part() }
