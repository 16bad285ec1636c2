-- Prepended to every script when it is loaded (redis::Scripts), so each rule
-- the Rust side also knows is written once here; `tests/scripts.rs` checks
-- that both sides agree.

-- The hex digits of a decimal number given as text, exact beyond 2^53 (Lua's
-- numbers are doubles), padded with zeros to `width`.
local function decimal_to_hex(text, width)
  local digits = {}
  for d in string.gmatch(text, '%d') do
    digits[#digits + 1] = tonumber(d)
  end
  local out = ''
  repeat
    local rest, quotient = 0, {}
    for i = 1, #digits do
      local value = rest * 10 + digits[i]
      local q = math.floor(value / 16)
      rest = value % 16
      if q > 0 or #quotient > 0 then
        quotient[#quotient + 1] = q
      end
    end
    out = string.sub('0123456789abcdef', rest + 1, rest + 1) .. out
    digits = quotient
  until #digits == 0
  return string.rep('0', width - #out) .. out
end

-- The branded id's text of `ms` and `seq` (numbers below 2^53): 12 hex
-- digits of milliseconds, 16 of sequence (id::BrandedId's Display).
local function branded_text(ms, seq)
  return string.format('%012x%016x', ms, seq)
end

-- The branded id derived from a stream id `<ms>-<seq>` given as text, as
-- id::BrandedId::from_stream_id derives it.
local function branded_of_stream_id(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return decimal_to_hex(ms, 12) .. decimal_to_hex(seq, 16)
end

-- Whether `text` is a branded id's text form: 28 lowercase hex characters
-- (id::BrandedId's FromStr).
local function is_branded_text(text)
  return #text == 28 and string.match(text, '^[0-9a-f]+$') ~= nil
end

-- Whether `text` is a shard count as sidecars record it: 1 to 1024 in plain
-- decimal (keys::is_recorded_count).
local function is_recorded_count(text)
  return string.match(text, '^[1-9]%d?%d?%d?$') ~= nil and tonumber(text) <= 1024
end

-- Stream ids `<ms>-<seq>` compared exactly, as decimal texts (Lua's doubles
-- lose digits past 2^53): true when a < b.
local function id_less(a, b)
  local a_ms, a_seq = string.match(a, '^(%d+)%-(%d+)$')
  local b_ms, b_seq = string.match(b, '^(%d+)%-(%d+)$')
  if a_ms ~= b_ms then
    if #a_ms ~= #b_ms then
      return #a_ms < #b_ms
    end
    return a_ms < b_ms
  end
  if #a_seq ~= #b_seq then
    return #a_seq < #b_seq
  end
  return a_seq < b_seq
end

-- The most ids `trim_counting_unread` reads ahead to count a group whose
-- last-delivered id falls inside the stream; past it that group's count is
-- unknown (reported as -1), never guessed.
local UNREAD_COUNT_LIMIT = 100000

-- Runs `xtrim` (a list: the XTRIM arguments after the key) on `stream` and
-- counts, per consumer group, the removed entries the group had not been
-- delivered yet: entries lost to that group for good. A trim removes the
-- oldest entries, so a group that has read into the stream lost
-- `removed - (entries up to its last-delivered id)`; those are read ahead
-- (ids up to the furthest such group's last-delivered id, at most
-- `most_removed` of them, nil: UNREAD_COUNT_LIMIT). Returns the number
-- removed and a flat list { group, count, … } of the groups that lost
-- entries (count -1: more than could be counted).
local function trim_counting_unread(stream, xtrim, most_removed)
  local oldest = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)[1]
  if oldest == nil then
    return 0, {}
  end
  local newest = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1][1]
  -- The groups that have not read the whole stream: { name, last, read
  -- into it (true) or not at all (false) }.
  local behind, furthest = {}, nil
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local info = {}
    for i = 1, #g, 2 do
      info[g[i]] = g[i + 1]
    end
    local last = info['last-delivered-id']
    if id_less(last, oldest[1]) then
      behind[#behind + 1] = { info['name'], last, false }
    elseif id_less(last, newest) then
      behind[#behind + 1] = { info['name'], last, true }
      if furthest == nil or id_less(furthest, last) then
        furthest = last
      end
    end
  end
  local limit = math.min(most_removed or UNREAD_COUNT_LIMIT, UNREAD_COUNT_LIMIT)
  local ahead = {}
  if furthest ~= nil and limit > 0 then
    for _, entry in ipairs(redis.call('XRANGE', stream, '-', furthest, 'COUNT', limit)) do
      ahead[#ahead + 1] = entry[1]
    end
  end
  local removed = redis.call('XTRIM', stream, unpack(xtrim))
  local lost = {}
  if removed == 0 then
    return removed, lost
  end
  for _, g in ipairs(behind) do
    local name, last, read_into = g[1], g[2], g[3]
    local count = removed
    if read_into then
      -- Entries up to `last`, of the oldest `removed`.
      local read = 0
      while read < #ahead and read < removed and not id_less(last, ahead[read + 1]) do
        read = read + 1
      end
      if read == #ahead and read < removed and #ahead == limit then
        count = -1
      else
        count = removed - read
      end
    end
    if count ~= 0 then
      lost[#lost + 1] = name
      lost[#lost + 1] = count
    end
  end
  return removed, lost
end

-- The largest millisecond a branded id can carry: 2^48 - 1 (its 6 bytes).
local MAX_BRANDED_MS = 281474976710655

-- The next stream id to mint on `stream`, as XADD * would pick it but with a
-- sequence congruent to `shard` modulo `shards` (0 and 1 for a plain stream),
-- so the shards of one sharded stream never mint the same id: Redis time, or
-- just after the stream's last generated id when that is not behind it.
-- Returns ms, seq (numbers) and the Redis time now (unix ms). Raises
-- WRONGTYPE when the key is not a stream. append.lua and ack_emit.lua mint
-- branded ids with it, move.lua the stream ids of scheduled entries entering
-- the stream; the caller checks MAX_BRANDED_MS.
local function next_stream_id(stream, shard, shards)
  local now = redis.call('TIME')
  local clock = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local ms, seq = clock, shard
  if redis.call('EXISTS', stream) == 1 then
    -- Raises WRONGTYPE when the key is not a stream.
    local info = redis.call('XINFO', 'STREAM', stream)
    for i = 1, #info, 2 do
      if info[i] == 'last-generated-id' then
        local last_ms, last_seq = string.match(info[i + 1], '^(%d+)%-(%d+)$')
        local last = tonumber(last_ms)
        if last >= ms then
          -- Sequences past 2^53 lose precision as Lua numbers: move to the next millisecond.
          if #last_seq > 15 then
            ms, seq = last + 1, shard
          else
            -- The first sequence after the last one that is this shard's.
            local next = tonumber(last_seq) + 1
            ms, seq = last, next + (shard - next) % shards
          end
        end
        break
      end
    end
  end
  return ms, seq, clock
end

-- A scheduled entry's fields as stored until it is due (the hash
-- `<stream>:scheduled:entries`): `ARGV[first…first + 2 * count - 1]`, name
-- and value pairs, each as `<byte length>:<bytes>`, concatenated.
local function encode_fields(first, count)
  local parts = {}
  for i = first, first + 2 * count - 1 do
    parts[#parts + 1] = #ARGV[i] .. ':' .. ARGV[i]
  end
  return table.concat(parts)
end

-- The flat list { name, value, … } `encode_fields` encoded in `text`.
local function decode_fields(text)
  local out, pos = {}, 1
  while pos <= #text do
    local colon = string.find(text, ':', pos, true)
    local length = tonumber(string.sub(text, pos, colon - 1))
    out[#out + 1] = string.sub(text, colon + 1, colon + length)
    pos = colon + length + 1
  end
  return out
end
