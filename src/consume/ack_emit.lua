-- AckEmit: appends what a handler produced for one source entry and
-- acknowledges the entry, in one step, and only while the entry is still
-- pending for this sidecar's consumer (the fence). So an entry's emits are
-- written exactly once, together with the XACK that takes it out of the PEL:
-- a second run for the same entry (a duplicate handler run, a retry after a
-- lost answer) finds it acknowledged and writes nothing; a run after a peer
-- reclaimed it finds it pending for the peer and writes nothing.
--
-- Unlike settle.lua, which XACKs whoever holds the entry, this checks the
-- owner first: the emits must never be written by a call that lost the entry.
--
-- KEYS[1]  the source stream
-- KEYS[2]  the group's retry hash
-- KEYS[3]  the group's keyed entries (`<stream>:keys:<group>`, per-key limits)
-- KEYS[4…] the emit streams, each once
-- ARGV[1]  the group
-- ARGV[2]  this sidecar's consumer
-- ARGV[3]  the reserved branded-id field name
-- ARGV[4]  the source entry's stream id
-- ARGV[5]  the trace context field name (`traceparent`)
-- ARGV[6]  the trace context to store in emits that set none; empty: the
--          source entry's own `traceparent` field, if it has one
-- ARGV[7]  the source entry's keyed member, removed with its XACK (its key
--          frees); empty: it has no key
-- ARGV[8]  the number of emits; then, per emit: the index in KEYS of its
--          stream, its shard index k and the shard count n (0 and 1 for a
--          plain stream: sequence numbers are minted congruent to k modulo
--          n, as append.lua does), its field count m, and m name/value
--          pairs; an emit without a trace context field gets ARGV[6]'s
--
-- Replies, { source stream id, tag, … }:
--   { id, 'not_pending' }          pending for no consumer (acknowledged already,
--                                  or the group was re-created): nothing written
--   { id, 'not_ours', consumer }   pending for another consumer (a peer
--                                  reclaimed it): nothing written
--   { id, 'emitted', emit id, … }  the emits' stream ids in order; the entry
--                                  is acknowledged, its retry state dropped

local source, retries, keyed = KEYS[1], KEYS[2], KEYS[3]
local group, consumer, id_field = ARGV[1], ARGV[2], ARGV[3]
local source_id, trace_field = ARGV[4], ARGV[5]

local pending = redis.call('XPENDING', source, group, source_id, source_id, 1)
if #pending == 0 then
  return { source_id, 'not_pending' }
end
if pending[1][2] ~= consumer then
  return { source_id, 'not_ours', pending[1][2] }
end

local trace = ARGV[6]
if trace == '' then
  local found = redis.call('XRANGE', source, source_id, source_id)
  if #found == 1 then
    local fields = found[1][2]
    for i = 1, #fields, 2 do
      if fields[i] == trace_field then
        trace = fields[i + 1]
        break
      end
    end
  end
end

-- Checked before anything is written: a script that fails half-way keeps
-- what it wrote. A key of the wrong type is refused here (WRONGTYPE, naming
-- it), and an emit that cannot be minted too, so a refusal leaves the entry
-- pending and nothing appended.
local function refuse_type(key, wanted)
  local found = redis.call('TYPE', key).ok
  if found ~= 'none' and found ~= wanted then
    return redis.error_reply('WRONGTYPE `' .. key .. '` holds a ' .. found .. ', not a ' .. wanted)
  end
end
local refused = refuse_type(retries, 'hash')
if refused then
  return refused
end
local emits = {}
local arg = 9
for e = 1, tonumber(ARGV[8]) do
  local key, shard, shards, count = tonumber(ARGV[arg]), tonumber(ARGV[arg + 1]), tonumber(ARGV[arg + 2]), tonumber(ARGV[arg + 3])
  local first = arg + 4
  local has_trace = false
  for i = first, first + 2 * count - 1, 2 do
    if ARGV[i] == trace_field then
      has_trace = true
    end
  end
  emits[e] = { KEYS[key], shard, shards, first, count, has_trace }
  arg = first + 2 * count
  refused = refuse_type(KEYS[key], 'stream')
  if refused then
    return refused
  end
  if next_stream_id(KEYS[key], shard, shards) > MAX_BRANDED_MS then
    return redis.error_reply('ERR echomq: the stream id would exceed the branded id range (milliseconds past 2^48)')
  end
end

local ids = { source_id, 'emitted' }
for _, emit in ipairs(emits) do
  local stream, shard, shards, first, count, has_trace = unpack(emit)
  local ms, seq = next_stream_id(stream, shard, shards)
  local id = string.format('%d-%d', ms, seq)
  local command = { 'XADD', stream, id, id_field, branded_text(ms, seq) }
  for i = first, first + 2 * count - 1 do
    command[#command + 1] = ARGV[i]
  end
  if trace ~= '' and not has_trace then
    command[#command + 1] = trace_field
    command[#command + 1] = trace
  end
  redis.call(unpack(command))
  ids[#ids + 1] = id
end
redis.call('XACK', source, group, source_id)
redis.call('HDEL', retries, source_id)
if ARGV[7] ~= '' then
  redis.call('ZREM', keyed, ARGV[7])
end
return ids
