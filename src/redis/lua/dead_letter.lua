-- Moves one pending entry to the dead-letter stream: append there first, then
-- acknowledge on the source, in one script, so the entry is never lost and
-- never in neither place.
--
-- KEYS[1]  the source stream
-- KEYS[2]  the dead-letter stream
-- ARGV[1]  the group
-- ARGV[2]  this sidecar's consumer
-- ARGV[3]  the entry's stream id
-- ARGV[4]  the reserved branded-id field name
-- ARGV[5]  the branded id
-- ARGV[6]  attempts (the delivery count)
-- ARGV[7]  the last failure reason
-- Returns the dead-letter stream id, or -1 when the entry is no longer pending
-- for this consumer (nothing done), or 0 when it was deleted from the source
-- while pending (then only acknowledged).
--
-- The dead-letter entry holds the branded id in the reserved field, the
-- metadata in `echomq.*` fields, then the original payload fields.

local source, dlq = KEYS[1], KEYS[2]
local group, consumer, id = ARGV[1], ARGV[2], ARGV[3]
if #redis.call('XPENDING', source, group, id, id, 1, consumer) == 0 then
  return -1
end
local found = redis.call('XRANGE', source, id, id)
if #found == 0 then
  redis.call('XACK', source, group, id)
  return 0
end
local command = {
  'XADD', dlq, '*', ARGV[4], ARGV[5],
  'echomq.source_stream', source,
  'echomq.source_id', id,
  'echomq.group', group,
  'echomq.attempts', ARGV[6],
  'echomq.reason', ARGV[7],
}
local fields = found[1][2]
for i = 1, #fields, 2 do
  if fields[i] ~= ARGV[4] then
    command[#command + 1] = fields[i]
    command[#command + 1] = fields[i + 1]
  end
end
local dead_id = redis.call(unpack(command))
redis.call('XACK', source, group, id)
return dead_id
