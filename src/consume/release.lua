-- Gives held entries back to the group at once, their delivery count
-- restored (a Release: the client never started them). Each entry stays in
-- this consumer's PEL but is made to look idle since long ago (XCLAIM … IDLE),
-- so any sidecar's next reclaim beat (XAUTOCLAIM with its min-idle) takes it
-- at once, and with one delivery less (XCLAIM … RETRYCOUNT <count - 1>), so
-- the claim that delivers it next (redeliver.lua's XCLAIM, which counts one)
-- says the same attempts as the delivery released. JUSTID: the claim itself
-- counts no delivery. On every supported server (XCLAIM has had IDLE and
-- RETRYCOUNT since 5.0); XNACK (Redis 8.8) is not used.
--
-- Only entries still pending for this sidecar's consumer (XPENDING …
-- consumer first): a peer may have reclaimed the entry since, and a plain
-- XCLAIM would steal it back, so two handlers would run it at once.
--
-- KEYS[1]  the stream
-- KEYS[2]  the group's retry hash
-- ARGV[1]  the group
-- ARGV[2]  this sidecar's consumer
-- ARGV[3]  the idle time to give released entries (ms): far above any
--          sidecar's --reclaim-min-idle-ms, far below the unix time (XCLAIM
--          makes an idle time reaching before the epoch 0)
-- ARGV[4…] stream ids
--
-- Replies, per id, in order:
--   { id, 'released', n }  given back: its delivery count is n now (one less
--                          than the delivery released; never below 0)
--   { id, 'not_ours' }     no longer pending for this consumer: nothing done
--   { id, 'deleted' }      deleted from the stream while pending:
--                          acknowledged, so it leaves the PEL

local stream, retries = KEYS[1], KEYS[2]
local group, consumer, idle = ARGV[1], ARGV[2], ARGV[3]

local out = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', stream, group, id, id, 1, consumer)
  if #pending == 0 then
    out[#out + 1] = { id, 'not_ours' }
  elseif #redis.call('XRANGE', stream, id, id) == 0 then
    redis.call('XACK', stream, group, id)
    redis.call('HDEL', retries, id)
    out[#out + 1] = { id, 'deleted' }
  else
    local count = math.max(pending[1][4] - 1, 0)
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'IDLE', idle, 'RETRYCOUNT', count, 'JUSTID')
    out[#out + 1] = { id, 'released', count }
  end
end
return out
