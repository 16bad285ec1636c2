-- A group's lag, for the scripts that report it: group_lag.lua (the KEDA
-- scaler's backlog) and group_state.lua (DescribeGroup and the polled
-- gauges), so both report the same figure. Prepended to them on load, after
-- the prelude (redis::Scripts).

-- A flat { name, value, … } reply (XINFO's, as scripts get it) as a table.
local function fields_of(flat)
  local out = {}
  for i = 1, #flat, 2 do
    out[flat[i]] = flat[i + 1]
  end
  return out
end

-- The entry of `groups` (an XINFO GROUPS reply) for `group`: its fields as a
-- table, and as Redis gave them (flat); nil when there is none.
local function find_group(groups, group)
  for _, g in ipairs(groups) do
    local fields = fields_of(g)
    if fields['name'] == group then
      return fields, g
    end
  end
  return nil
end

-- The lag of the group whose XINFO GROUPS fields are `info` on `stream`: the
-- entries of the stream after its last-delivered id, or false where that
-- cannot be known cheaply. Never a false figure: Redis 7.0 and 7.1 miscount
-- XINFO GROUPS `lag` for good once a trim has removed entries the group had
-- not read (7.2 fixed it), and 6.2 has no `lag`.
--
-- Exact, whatever the server: 0 when the group has read the last entry; the
-- stream's length when it has read nothing still in the stream; else Redis'
-- own `lag` on 7.2 and later, or on 7.0/7.1 when nothing was ever removed
-- from the stream (entries-added equals the length, so the group's
-- entries-read is right); else a count of the entries after the
-- last-delivered id, up to `limit` (XRANGE); false beyond it.
local function group_lag(stream, info, limit)
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
end
