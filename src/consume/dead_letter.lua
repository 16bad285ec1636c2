-- Moves entries pending for this sidecar's consumer to the dead-letter
-- stream: appends each there, then acknowledges it on the source, in this
-- order and in one script, so it is never in neither place.
--
-- The dead-letter entry: the branded id in the reserved field (derived from
-- the stream id when the entry has none), metadata in `echomq.*` fields (the
-- names `src/consume/dead_letter.rs` reads back), then the original payload
-- fields.
--
-- KEYS[1]  the stream
-- KEYS[2]  the dead-letter stream
-- KEYS[3]  the group's retry hash
-- KEYS[4]  the group's keyed entries (`<stream>:keys:<group>`, per-key limits)
-- ARGV[1]  the group
-- ARGV[2]  this sidecar's consumer
-- ARGV[3]  the reserved branded-id field name
-- ARGV[4]  the group's key field; empty: it has none
-- ARGV[5…] pairs: stream id, the reason it is dead-lettered
--
-- A dead-lettered entry with a key leaves the keyed entries with its XACK,
-- so its key frees (its member is rebuilt from its fields, as
-- keyed_read.lua built it).
--
-- Replies, per id, in order:
--   { id, 'not_ours' }                 no longer pending for this consumer: nothing done
--   { id, 'deleted' }                  deleted from the stream while pending:
--                                      acknowledged, so it leaves the PEL
--   { id, 'dead_lettered', dead_id, n } appended as dead_id after n deliveries

local stream, dead_letters, retries, keyed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, consumer, id_field, key_field = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)

-- The entry's branded id: its reserved field, else derived from its stream id.
local function branded_id(id, fields)
  for i = 1, #fields, 2 do
    if fields[i] == id_field and is_branded_text(fields[i + 1]) then
      return fields[i + 1]
    end
  end
  return branded_of_stream_id(id)
end

local out = {}
for i = 5, #ARGV, 2 do
  local id, reason = ARGV[i], ARGV[i + 1]
  local pending = redis.call('XPENDING', stream, group, id, id, 1, consumer)
  local found = #pending == 1 and redis.call('XRANGE', stream, id, id) or {}
  if #pending == 0 then
    out[#out + 1] = { id, 'not_ours' }
  elseif #found == 0 then
    redis.call('XACK', stream, group, id)
    redis.call('HDEL', retries, id)
    out[#out + 1] = { id, 'deleted' }
  else
    local deliveries = pending[1][4]
    local fields = found[1][2]
    local command = {
      'XADD', dead_letters, '*', id_field, branded_id(id, fields),
      'echomq.source_stream', stream,
      'echomq.source_id', id,
      'echomq.group', group,
      'echomq.attempts', tostring(deliveries),
      'echomq.reason', reason,
      'echomq.dead_lettered_at_ms', tostring(now_ms),
    }
    for f = 1, #fields, 2 do
      if fields[f] ~= id_field then
        command[#command + 1] = fields[f]
        command[#command + 1] = fields[f + 1]
      end
    end
    local dead_id = redis.call(unpack(command))
    redis.call('XACK', stream, group, id)
    redis.call('HDEL', retries, id)
    local key = key_field ~= '' and key_in(fields, key_field)
    if key then
      redis.call('ZREM', keyed, member_of(key, id))
    end
    out[#out + 1] = { id, 'dead_lettered', dead_id, deliveries }
  end
end
return out
