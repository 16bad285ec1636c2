-- Claims due entries for re-delivery, only those still pending for this
-- sidecar's consumer, honouring the retry delay recorded in the group's retry
-- hash (so a delay outlives a restart and binds a peer that reclaimed the
-- entry).
--
-- Why every id is first looked up in this consumer's own PEL (XPENDING …
-- consumer): a peer may have reclaimed the entry (XAUTOCLAIM) since this
-- consumer last touched it, and a plain XCLAIM with min-idle-time 0 would steal
-- it back, so two handlers would run it at once.
--
-- KEYS[1]  the stream
-- KEYS[2]  the group's retry hash: stream id → "<due unix ms> <last failure reason>",
--          or "<due unix ms>t <reason>" after a transient failure, which
--          does not count: its re-delivery keeps the delivery count
-- ARGV[1]  the group
-- ARGV[2]  this sidecar's consumer
-- ARGV[3]  max deliveries (0: no limit)
-- ARGV[4…] stream ids
--
-- Replies, per id, in order:
--   { id, 'not_ours' }                   no longer pending for this consumer: nothing done
--   { id, 'deleted' }                    deleted from the stream while pending:
--                                        acknowledged, so it leaves the PEL
--   { id, 'not_due', due_ms }            its retry delay has not passed: not claimed
--   { id, 'poison', n, reason }          n deliveries reached max deliveries: not
--                                        claimed; the caller dead-letters it
--   { id, 'claimed', n, { field, … } }   claimed: n is its delivery count now (one
--                                        more than before, or the same after a
--                                        transient failure: XCLAIM … RETRYCOUNT)

local stream, retries = KEYS[1], KEYS[2]
local group, consumer, max_deliveries = ARGV[1], ARGV[2], tonumber(ARGV[3])

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)

local out = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', stream, group, id, id, 1, consumer)
  if #pending == 0 then
    out[#out + 1] = { id, 'not_ours' }
  else
    local deliveries = pending[1][4]
    local due, transient, reason = 0, false, ''
    local state = redis.call('HGET', retries, id)
    if state then
      local d, t, r = string.match(state, '^(%d+)(t?) ?(.*)$')
      due, transient, reason = tonumber(d) or 0, t == 't', r or ''
    end
    if #redis.call('XRANGE', stream, id, id) == 0 then
      redis.call('XACK', stream, group, id)
      redis.call('HDEL', retries, id)
      out[#out + 1] = { id, 'deleted' }
    elseif due > now_ms then
      out[#out + 1] = { id, 'not_due', due }
    elseif not transient and max_deliveries > 0 and deliveries >= max_deliveries then
      out[#out + 1] = { id, 'poison', deliveries, reason }
    elseif transient then
      -- Its count stays, and its state goes: its ack, at attempts 1 still,
      -- drops no state, and a later re-delivery without a verdict (its call
      -- ended, its deadline passed) writes one that counts again.
      local claimed = redis.call('XCLAIM', stream, group, consumer, 0, id, 'RETRYCOUNT', deliveries)
      redis.call('HDEL', retries, id)
      out[#out + 1] = { id, 'claimed', deliveries, claimed[1][2] }
    else
      local claimed = redis.call('XCLAIM', stream, group, consumer, 0, id)
      out[#out + 1] = { id, 'claimed', deliveries + 1, claimed[1][2] }
    end
  end
end
return out
