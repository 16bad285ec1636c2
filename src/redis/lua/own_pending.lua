-- Operations on entries pending for this sidecar's consumer, and only those.
--
-- KEYS[1]  the stream
-- KEYS[2]  the dead-letter stream
-- KEYS[3]  the group's retry hash: stream id → "<due unix ms> <last failure reason>"
-- ARGV[1]  the group
-- ARGV[2]  this sidecar's consumer
-- ARGV[3]  the mode: 'deliver', 'refresh' or 'dead_letter'
-- ARGV[4]  the reserved branded-id field name
-- ARGV[5]  max deliveries (0: no limit)              ('deliver')
--          the failure reason                         ('dead_letter')
-- ARGV[6…] stream ids
--
-- Why every id is first looked up in this consumer's own PEL (XPENDING …
-- consumer): a peer may have reclaimed the entry (XAUTOCLAIM) since this
-- consumer last touched it, and a plain XCLAIM with min-idle-time 0 would steal
-- it back, so two handlers would run it at once.
--
-- Replies, per id, in order:
--   { id, -1 }                      no longer pending for this consumer: nothing done
--   { id, 0 }                       deleted from the stream while pending: acknowledged
--                                   so it leaves the PEL
--   { id, -2, due_ms }              ('deliver') its retry delay has not passed: not claimed
--   { id, -3, dead_letter_id, n }   dead-lettered after n deliveries
--   { id, n, { field, value, … } }  ('deliver') claimed: n is its delivery count now
-- 'refresh' resets the idle time (XCLAIM … JUSTID, no delivery counted) and
-- replies only for the ids it could not refresh:
--   { id, -1 }                      another consumer has it pending (a peer
--                                   reclaimed it)
--   { id, 0 }                       deleted from the stream (XCLAIM claims
--                                   nothing for it): acknowledged, as above
--   { id, -4 }                      pending for no consumer (acknowledged by
--                                   another client, or the group was re-created
--                                   and has not read it again yet)

local stream, dead_letters, retries = KEYS[1], KEYS[2], KEYS[3]
local group, consumer, mode, id_field = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)

-- Appends the entry to the dead-letter stream, then acknowledges it on the
-- source: in this order and in one script, so it is never in neither place.
-- The dead-letter entry: the branded id in the reserved field (derived from the
-- stream id when the entry has none), metadata in `echomq.*` fields, then the
-- original payload fields.
local function dead_letter(id, fields, deliveries, reason)
  local branded
  for i = 1, #fields, 2 do
    if fields[i] == id_field and string.match(fields[i + 1], '^[0-9a-f]+$') and #fields[i + 1] == 28 then
      branded = fields[i + 1]
      break
    end
  end
  if not branded then
    local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
    branded = string.format('%012x%016x', tonumber(ms), tonumber(seq))
  end
  local command = {
    'XADD', dead_letters, '*', id_field, branded,
    'echomq.source_stream', stream,
    'echomq.source_id', id,
    'echomq.group', group,
    'echomq.attempts', tostring(deliveries),
    'echomq.reason', reason,
    'echomq.dead_lettered_at_ms', tostring(now_ms),
  }
  for i = 1, #fields, 2 do
    if fields[i] ~= id_field then
      command[#command + 1] = fields[i]
      command[#command + 1] = fields[i + 1]
    end
  end
  local dead_id = redis.call(unpack(command))
  redis.call('XACK', stream, group, id)
  redis.call('HDEL', retries, id)
  return dead_id
end

local function retry_state(id)
  local state = redis.call('HGET', retries, id)
  if not state then
    return 0, ''
  end
  local due, reason = string.match(state, '^(%d+) ?(.*)$')
  return tonumber(due) or 0, reason or ''
end

local out = {}
for i = 6, #ARGV do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', stream, group, id, id, 1, consumer)
  if mode == 'refresh' then
    if #pending == 1 then
      if #redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID') == 0 then
        -- Redis 7 drops a deleted entry from the PEL here; older versions keep it.
        redis.call('XACK', stream, group, id)
        redis.call('HDEL', retries, id)
        out[#out + 1] = { id, 0 }
      end
    elseif #redis.call('XPENDING', stream, group, id, id, 1) == 1 then
      out[#out + 1] = { id, -1 }
    elseif #redis.call('XRANGE', stream, id, id) == 0 then
      -- A peer's XAUTOCLAIM drops deleted entries from the whole group's PEL.
      redis.call('HDEL', retries, id)
      out[#out + 1] = { id, 0 }
    else
      out[#out + 1] = { id, -4 }
    end
  elseif #pending == 0 then
    out[#out + 1] = { id, -1 }
  else
    local deliveries = pending[1][4]
    local due, reason = retry_state(id)
    local found = redis.call('XRANGE', stream, id, id)
    if #found == 0 then
      redis.call('XACK', stream, group, id)
      redis.call('HDEL', retries, id)
      out[#out + 1] = { id, 0 }
    elseif mode == 'dead_letter' then
      out[#out + 1] = { id, -3, dead_letter(id, found[1][2], deliveries, ARGV[5]), deliveries }
    elseif due > now_ms then
      out[#out + 1] = { id, -2, due }
    elseif tonumber(ARGV[5]) > 0 and deliveries >= tonumber(ARGV[5]) then
      if reason == '' then
        reason = 'max deliveries reached'
      end
      out[#out + 1] = { id, -3, dead_letter(id, found[1][2], deliveries, reason), deliveries }
    else
      local claimed = redis.call('XCLAIM', stream, group, consumer, 0, id)
      out[#out + 1] = { id, deliveries + 1, claimed[1][2] }
    end
  end
end
return out
