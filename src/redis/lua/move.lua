-- Moves a stream's due scheduled entries into the stream, in one step: each
-- entry is XADDed (carrying the branded id append.lua minted for it, in the
-- reserved field) and removed from the schedule together, so a sidecar killed
-- at any moment leaves every entry either still scheduled or in the stream
-- once, never both and never neither.
--
-- KEYS[1]  the stream
-- KEYS[2]  its schedule (`<stream>:scheduled`: branded id by due unix ms)
-- KEYS[3]  its scheduled entries (`<stream>:scheduled:entries`: branded id →
--          encode_fields of the fields; `shard` → `<k> <n>`)
-- ARGV[1]  the reserved field that carries the branded id
-- ARGV[2]  the most entries to move in this step
-- Returns { moved, next due }: moved a flat list { branded id, stream id, … }
-- in due order; next due the unix ms (as text) the schedule's first entry is
-- due at, or false when the schedule is empty.
--
-- Entries due in the same millisecond enter in branded-id order. Each gets a
-- stream id minted as append.lua mints one (Redis time, after the stream's
-- last id, the shard's stride), so a stream id is still never below an
-- earlier one; the branded id is older than the stream id: for scheduled
-- entries branded-id order is not stream order.

local stream, schedule, entries = KEYS[1], KEYS[2], KEYS[3]
local shard, shards = 0, 1
local stride = redis.call('HGET', entries, 'shard')
if stride then
  local k, n = string.match(stride, '^(%d+) (%d+)$')
  if k then
    shard, shards = tonumber(k), tonumber(n)
  end
end
local now = redis.call('TIME')
local clock = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', schedule, '-inf', clock, 'LIMIT', 0, tonumber(ARGV[2]))
-- Nothing due (an index score earlier than the schedule): the stream is not
-- read at all, so even a key that is no stream costs nothing here.
local ms, seq = 0, 0
if #due > 0 then
  ms, seq = next_stream_id(stream, shard, shards)
end
local moved = {}
for _, branded in ipairs(due) do
  local encoded = redis.call('HGET', entries, branded)
  if encoded then
    local id = string.format('%d-%d', ms, seq)
    local command = { 'XADD', stream, id, ARGV[1], branded }
    for _, part in ipairs(decode_fields(encoded)) do
      command[#command + 1] = part
    end
    redis.call(unpack(command))
    moved[#moved + 1] = branded
    moved[#moved + 1] = id
    seq = seq + shards
  end
  redis.call('ZREM', schedule, branded)
  redis.call('HDEL', entries, branded)
end
local first = redis.call('ZRANGE', schedule, 0, 0, 'WITHSCORES')
if first[2] == nil then
  redis.call('DEL', entries)
  return { moved, false }
end
return { moved, first[2] }
