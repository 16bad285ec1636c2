-- Removes one scheduled entry before it is moved into its stream: the removal
-- and move.lua's move are each one step, so exactly one of them takes it.
--
-- KEYS[1]  the stream's schedule (`<stream>:scheduled`)
-- KEYS[2]  its scheduled entries (`<stream>:scheduled:entries`)
-- ARGV[1]  the entry's branded id
-- Returns the unix ms (as text) it was due at, or false when it is not
-- scheduled (moved already, cancelled, or never scheduled here).

local due = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not due then
  return false
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2])
end
return due
