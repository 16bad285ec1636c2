-- Claims entries that are still pending for this consumer, and only those.
--
-- KEYS[1]  the stream
-- ARGV[1]  the group
-- ARGV[2]  this sidecar's consumer
-- ARGV[3]  'deliver' or 'refresh'
-- ARGV[4…] stream ids
--
-- A peer may have reclaimed an entry (XAUTOCLAIM) since this consumer last
-- touched it. A plain XCLAIM with min-idle-time 0 would steal it back and two
-- handlers would run it at once, so every id is first looked up in this
-- consumer's own PEL (XPENDING … <consumer>).
--
-- 'deliver': XCLAIM counts one more delivery and returns the entry. Reply, per
--   id: { id, delivery count after the claim, { field, value, … } }, or
--   { id, -1 } when the entry is no longer pending for this consumer, or
--   { id, 0 } when it was deleted from the stream while pending (it is then
--   acknowledged so it leaves the PEL).
-- 'refresh': XCLAIM … JUSTID resets the idle time without counting a
--   delivery. Reply: the ids that are no longer pending for this consumer.

local stream, group, consumer, mode = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local out = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', stream, group, id, id, 1, consumer)
  if mode == 'refresh' then
    if #pending == 0 then
      out[#out + 1] = id
    else
      redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID')
    end
  elseif #pending == 0 then
    out[#out + 1] = { id, -1 }
  else
    local claimed = redis.call('XCLAIM', stream, group, consumer, 0, id)
    local entry = claimed[1]
    if entry and entry[2] then
      out[#out + 1] = { id, pending[1][4] + 1, entry[2] }
    else
      redis.call('XACK', stream, group, id)
      out[#out + 1] = { id, 0 }
    end
  end
end
return out
