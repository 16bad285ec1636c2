-- A group's lag: the entries of the stream after its last-delivered id, or
-- nil where that cannot be known cheaply. Never a false figure: Redis 7.0
-- and 7.1 miscount XINFO GROUPS `lag` for good once a trim has removed
-- entries the group had not read (7.2 fixed it), and 6.2 has no `lag`.
--
-- Exact, whatever the server: 0 when the group has read the last entry; the
-- stream's length when it has read nothing still in the stream; else Redis'
-- own `lag` on 7.2 and later, or on 7.0/7.1 when nothing was ever removed
-- from the stream (entries-added equals the length, so the group's
-- entries-read is right); else a count of the entries after the
-- last-delivered id, up to LIMIT; nil beyond it.
--
-- KEYS[1]  the stream
-- ARGV[1]  the group
-- ARGV[2]  LIMIT: the most entries counted one by one (XRANGE)
-- Returns the lag, or nil. Errors NOGROUP-like when the group is missing.

local stream, group, limit = KEYS[1], ARGV[1], tonumber(ARGV[2])

local function fields_of(flat)
  local out = {}
  for i = 1, #flat, 2 do
    out[flat[i]] = flat[i + 1]
  end
  return out
end

local info
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local candidate = fields_of(g)
  if candidate['name'] == group then
    info = candidate
  end
end
if info == nil then
  return redis.error_reply('NOGROUP no group ' .. group .. ' on ' .. stream)
end
local length = redis.call('XLEN', stream)
if length == 0 then
  return 0
end
local last_delivered = info['last-delivered-id']
local first = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)[1][1]
local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1][1]
if not id_less(last_delivered, last) then
  return 0
end
if id_less(last_delivered, first) then
  return length
end
local reported = info['lag']
if type(reported) == 'number' then
  if (redis.REDIS_VERSION_NUM or 0) >= 0x070200 then
    return reported
  end
  local added = fields_of(redis.call('XINFO', 'STREAM', stream))['entries-added']
  if added == length then
    return reported
  end
end
local after = redis.call('XRANGE', stream, '(' .. last_delivered, '+', 'COUNT', limit + 1)
if #after <= limit then
  return #after
end
return false
