-- Keeps the leases of entries this sidecar holds: resets their PEL idle time
-- (XCLAIM … JUSTID, which counts no delivery), so a peer's reclaim beat does
-- not take them from a live handler; only for entries still pending for this
-- consumer (XPENDING … consumer first: a plain XCLAIM would steal back an
-- entry a peer already reclaimed).
--
-- KEYS[1]  the stream
-- KEYS[2]  the group's retry hash
-- ARGV[1]  the group
-- ARGV[2]  this sidecar's consumer
-- ARGV[3]  '1' when a claim does not tell a deleted entry (Redis 6.2: XCLAIM
--          JUSTID returns its id as if it were there), so the stream is
--          looked at (XRANGE) after each claim; '0' from Redis 7.0 on
-- ARGV[4…] stream ids
--
-- Replies only for the ids it could not refresh, in order:
--   { id, 'to_peer' }   another consumer has it pending (a peer reclaimed it)
--   { id, 'deleted' }   deleted from the stream: dropped from the PEL (Redis 7
--                       does so in XCLAIM, 6.2 by the XACK here)
--   { id, 'unowned' }   pending for no consumer (acknowledged by another
--                       client, or the group was re-created and has not read
--                       it again yet)

local stream, retries = KEYS[1], KEYS[2]
local group, consumer = ARGV[1], ARGV[2]
local look = ARGV[3] == '1'

local out = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  if #redis.call('XPENDING', stream, group, id, id, 1, consumer) == 1 then
    if #redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID') == 0
      or (look and #redis.call('XRANGE', stream, id, id) == 0) then
      redis.call('XACK', stream, group, id)
      redis.call('HDEL', retries, id)
      out[#out + 1] = { id, 'deleted' }
    end
  elseif #redis.call('XPENDING', stream, group, id, id, 1) == 1 then
    out[#out + 1] = { id, 'to_peer' }
  elseif #redis.call('XRANGE', stream, id, id) == 0 then
    -- A peer's XAUTOCLAIM drops deleted entries from the whole group's PEL.
    redis.call('HDEL', retries, id)
    out[#out + 1] = { id, 'deleted' }
  else
    out[#out + 1] = { id, 'unowned' }
  end
end
return out
