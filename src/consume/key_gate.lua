-- The per-key gate, shared by keyed_read.lua and keys_gate.lua (prepended
-- to both on load). See src/consume/keyed.rs.
--
-- The group's keyed entries are one sorted set, every score 0, member
-- `<key length>:<key bytes>:<ms>-<seq>` with ms and seq zero-padded to 20
-- digits: ZRANGEBYLEX over one key's prefix lists its entries in stream
-- order. The set mirrors the group's PEL for keyed entries.

-- A decimal number zero-padded to 20 digits.
local function pad20(digits)
  return string.rep('0', 20 - #digits) .. digits
end

-- The member of entry `id` (`<ms>-<seq>`) whose key is `key`.
local function member_of(key, id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return #key .. ':' .. key .. ':' .. pad20(ms) .. '-' .. pad20(seq)
end

-- The stream id (`<ms>-<seq>`) of a member. String work only: a Lua number
-- (a double) cannot hold every 64-bit sequence number.
local function id_of_member(member)
  local tail = string.sub(member, -41)
  local ms = (string.gsub(string.sub(tail, 1, 20), '^0+', ''))
  local seq = (string.gsub(string.sub(tail, 22, 41), '^0+', ''))
  if ms == '' then ms = '0' end
  if seq == '' then seq = '0' end
  return ms .. '-' .. seq
end

-- The value of the first field named `field` of an entry's flat field list;
-- nil when it has none (the entry is not limited).
local function key_in(fields, field)
  if not fields then
    return nil
  end
  for f = 1, #fields, 2 do
    if fields[f] == field then
      return fields[f + 1]
    end
  end
  return nil
end

-- Whether the entry `member` may run now: it is among the first `limit`
-- members of its key. A member missing from the set (read before the group
-- had a key field, or by an older sidecar) is added first. Members ahead of
-- it that the group no longer has pending (acknowledged by any client,
-- dead-lettered, deleted, a re-created group) are removed on the way: the
-- lazy clean-up that keeps the set true to the PEL.
local function key_admits(stream, zset, group, limit, member)
  local prefix = string.sub(member, 1, #member - 41)
  if not redis.call('ZSCORE', zset, member) then
    redis.call('ZADD', zset, 0, member)
  end
  while true do
    local firsts = redis.call('ZRANGEBYLEX', zset, '[' .. prefix, '(' .. prefix .. '\255', 'LIMIT', 0, limit)
    for _, first in ipairs(firsts) do
      if first == member then
        return true
      end
    end
    local removed = false
    for _, first in ipairs(firsts) do
      local id = id_of_member(first)
      if #redis.call('XPENDING', stream, group, id, id, 1) == 0 then
        redis.call('ZREM', zset, first)
        removed = true
      end
    end
    if not removed then
      return false
    end
  end
end
