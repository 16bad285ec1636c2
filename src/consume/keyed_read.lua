-- Reads new entries for a group with per-key limits, registering each keyed
-- entry in the group's keyed entries in the same step (so two sidecars
-- reading at once register their entries in stream order) and putting it
-- through the gate (key_gate.lua). Never blocks: a script cannot. When it
-- reads nothing it answers the stream's last entry id, and the reader waits
-- for anything newer with `XREAD BLOCK … STREAMS <stream> <that id>` on its
-- own connection, then runs this again.
--
-- KEYS[1]  the stream
-- KEYS[2]  the group's keyed entries (`<stream>:keys:<group>`)
-- ARGV[1]  the group
-- ARGV[2]  this sidecar's consumer
-- ARGV[3]  count, the most entries to read
-- ARGV[4]  the key field
-- ARGV[5]  the limit: the most entries of one key held at once
--
-- Replies:
--   { 'entries', { { id, { field, value, … } }, … }, { flag, … } }
--        the entries read (as XREADGROUP gives them), and per entry in
--        order: 0 it has no key field, 1 it may run now, 2 it waits
--   { 'none', last id }   nothing new: the stream's last entry id (`0-0`
--                          when it is empty)
-- NOGROUP (the group or the stream is gone) is XREADGROUP's error, as is.

local stream, zset = KEYS[1], KEYS[2]
local group, consumer, count, field = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local limit = tonumber(ARGV[5])

local read = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count, 'STREAMS', stream, '>')
if not read or #read == 0 or #read[1][2] == 0 then
  local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
  return { 'none', last[1] and last[1][1] or '0-0' }
end
local entries = read[1][2]
local flags = {}
for i, entry in ipairs(entries) do
  local key = key_in(entry[2], field)
  if not key then
    flags[i] = 0
  elseif key_admits(stream, zset, group, limit, member_of(key, entry[1])) then
    flags[i] = 1
  else
    flags[i] = 2
  end
end
return { 'entries', entries, flags }
