-- The per-key gate (key_gate.lua) for entries this sidecar holds pending but
-- has not handed to a call: reclaimed (XAUTOCLAIM), found in its own PEL
-- after a restart, due again after a Fail, or waiting for their key.
--
-- Fenced: a candidate must still be pending for this sidecar's consumer. One
-- a peer took (this sidecar was paused past the reclaim idle time) or that
-- left the PEL (acknowledged by the peer, dead-lettered, deleted) is answered
-- -1 and not touched: re-adding its member would mark its key busy for an
-- entry nobody holds, and handing it out would run it beside, or after, the
-- peer's run.
--
-- KEYS[1]  the stream
-- KEYS[2]  the group's keyed entries (`<stream>:keys:<group>`)
-- ARGV[1]  the group
-- ARGV[2]  the limit: the most entries of one key held at once
-- ARGV[3]  this sidecar's consumer
-- ARGV[4…] the candidates' members, each key's in stream order
--
-- Replies, per candidate in order: 1 it may run now, 0 it waits, -1 it is no
-- longer this consumer's.

local stream, zset = KEYS[1], KEYS[2]
local group, limit, me = ARGV[1], tonumber(ARGV[2]), ARGV[3]

local out = {}
for i = 4, #ARGV do
  local id = id_of_member(ARGV[i])
  local pending = redis.call('XPENDING', stream, group, id, id, 1)
  if #pending == 0 or pending[1][2] ~= me then
    out[#out + 1] = -1
  else
    out[#out + 1] = key_admits(stream, zset, group, limit, ARGV[i]) and 1 or 0
  end
end
return out
