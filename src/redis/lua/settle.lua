-- Applies a batch of verdicts in one round trip and one command: XACK each
-- acknowledged entry still pending for this consumer (one by one, so the
-- reply says which were), drop the retry state of those that had any, and
-- record the retry state of newly failed ones still pending for it.
--
-- Why each id is first looked up in this consumer's own PEL (XPENDING …
-- consumer): XACK takes an entry off the group's PEL whoever holds it, so
-- after a peer reclaimed an entry this sidecar's late verdict would settle
-- the peer's delivery.
--
-- KEYS[1]  the stream
-- KEYS[2]  the group's retry hash: stream id → "<due unix ms> <reason>"
-- ARGV[1]  the group
-- ARGV[2]  this sidecar's consumer
-- ARGV[3]  a, the number of entries to acknowledge; then a stream ids
-- then     c, the number of retry states to drop once acknowledged; then c
--          stream ids (each also among the a)
-- then     w, the number of retry states to write; then w (stream id, state) pairs
-- Returns, per acknowledged id then per retry state to write, in order: 1
-- when applied, 0 when the entry was not pending for this consumer.

local stream, retries, group, consumer = KEYS[1], KEYS[2], ARGV[1], ARGV[2]

local function mine(id)
  return #redis.call('XPENDING', stream, group, id, id, 1, consumer) == 1
end

local out, acked = {}, {}
local i = 3
local acks = tonumber(ARGV[i])
for k = 1, acks do
  local id = ARGV[i + k]
  out[#out + 1] = 0
  if mine(id) then
    out[#out] = redis.call('XACK', stream, group, id)
    acked[id] = true
  end
end
i = i + acks + 1
local clears = tonumber(ARGV[i])
for k = 1, clears do
  if acked[ARGV[i + k]] then
    redis.call('HDEL', retries, ARGV[i + k])
  end
end
i = i + clears + 1
local writes = tonumber(ARGV[i])
for k = 1, writes do
  local id = ARGV[i + 2 * k - 1]
  out[#out + 1] = 0
  if mine(id) then
    redis.call('HSET', retries, id, ARGV[i + 2 * k])
    out[#out] = 1
  end
end
return out
