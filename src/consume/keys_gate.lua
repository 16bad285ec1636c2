-- The per-key gate (key_gate.lua) for entries this sidecar holds pending but
-- has not handed to a call: reclaimed (XAUTOCLAIM), found in its own PEL
-- after a restart, due again after a Fail, or waiting for their key.
--
-- KEYS[1]  the stream
-- KEYS[2]  the group's keyed entries (`<stream>:keys:<group>`)
-- ARGV[1]  the group
-- ARGV[2]  the limit: the most entries of one key held at once
-- ARGV[3…] the candidates' members, each key's in stream order
--
-- Replies, per candidate in order: 1 it may run now, 0 it waits.

local stream, zset = KEYS[1], KEYS[2]
local group, limit = ARGV[1], tonumber(ARGV[2])

local out = {}
for i = 3, #ARGV do
  out[#out + 1] = key_admits(stream, zset, group, limit, ARGV[i]) and 1 or 0
end
return out
