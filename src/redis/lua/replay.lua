-- Moves dead letters back to their source stream: for each, append it there
-- (a new stream id, the same branded id in the reserved field, the original
-- payload without the `echomq.*` metadata), then delete it from the
-- dead-letter stream. One script, so an entry is never in neither place. An
-- entry whose recorded `echomq.source_stream` is another stream (two streams
-- may share a dead-letter stream) is left where it is.
--
-- KEYS[1]  the source stream
-- KEYS[2]  the dead-letter stream
-- ARGV[1]  the reserved branded-id field name
-- ARGV[2…] dead-letter stream ids
-- Returns { replayed, other_source }: per id replayed, { dead-letter id, new
-- stream id, branded id field value or '' }; the ids left because their
-- source is another stream. Ids not found are in neither.
-- Refuses, moving nothing, with `ECHOMQ_NO_SOURCE` when the source stream does
-- not exist and `ECHOMQ_NO_GROUP` when it has no consumer group: replayed
-- entries would reach no consumer (a group created later at `$` skips them);
-- and with `ECHOMQ_EMPTY <id>` when a dead letter of the batch has nothing
-- but `echomq.*` metadata (an entry needs a field; not one the sidecar wrote).

local source, dead_letters = KEYS[1], KEYS[2]
if redis.call('EXISTS', source) == 0 then
  return redis.error_reply('ECHOMQ_NO_SOURCE the stream does not exist')
end
-- Raises WRONGTYPE when the key is not a stream.
if #redis.call('XINFO', 'GROUPS', source) == 0 then
  return redis.error_reply('ECHOMQ_NO_GROUP the stream has no consumer group')
end
local replayed, other_source, found = {}, {}, {}
for i = 2, #ARGV do
  local entry = redis.call('XRANGE', dead_letters, ARGV[i], ARGV[i])[1]
  if entry then
    local payload = false
    for f = 1, #entry[2], 2 do
      payload = payload or string.sub(entry[2][f], 1, 7) ~= 'echomq.'
    end
    if not payload then
      return redis.error_reply('ECHOMQ_EMPTY ' .. ARGV[i])
    end
    found[i] = entry
  end
end
for i = 2, #ARGV do
  if found[i] then
    local fields = found[i][2]
    local command = { 'XADD', source, '*' }
    local branded, recorded = '', nil
    for f = 1, #fields, 2 do
      if fields[f] == ARGV[1] and branded == '' then
        branded = fields[f + 1]
      end
      if fields[f] == 'echomq.source_stream' then
        recorded = fields[f + 1]
      end
      if string.sub(fields[f], 1, 7) ~= 'echomq.' then
        command[#command + 1] = fields[f]
        command[#command + 1] = fields[f + 1]
      end
    end
    if recorded ~= nil and recorded ~= source then
      other_source[#other_source + 1] = ARGV[i]
    else
      local id = redis.call(unpack(command))
      redis.call('XDEL', dead_letters, ARGV[i])
      replayed[#replayed + 1] = { ARGV[i], id, branded }
    end
  end
end
return { replayed, other_source }
