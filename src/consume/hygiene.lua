-- Consumer hygiene, one run per beat of every sidecar serving the group:
-- records this sidecar's heartbeat, then, on a thorough beat and when a
-- limit is set, removes the group's consumers that are dead and hold nothing.
--
-- Most beats are light: the heartbeat alone (XPENDING of no entries to see
-- that the group exists, TIME, HSET, HVALS). Only a thorough beat, every
-- eighth of the limit or so (hygiene.rs), lists the consumers: XINFO
-- CONSUMERS and an HGET per consumer, which every sidecar of a group of a
-- thousand consumers ran every 10 s, a thousand commands each.
--
-- Liveness comes from the heartbeat, not from XINFO's idle time: Redis 7.0
-- does not refresh a consumer's idle time on an empty XREADGROUP nor on an
-- XAUTOCLAIM that claims nothing, so a live sidecar on a quiet stream looks
-- idle. A consumer is removed only when XINFO says it is idle past the limit,
-- it has no pending entries (XGROUP DELCONSUMER would drop its PEL and lose
-- them), and its heartbeat is missing (a consumer that is not a sidecar) or
-- older than the limit. The check and the removal happen in one script, so
-- nothing can be delivered to it in between. Times are Redis' own (TIME), so
-- the sidecars' clocks need not agree.
--
-- A group that no longer exists (its stream deleted, or XGROUP DESTROY
-- behind the sidecars' back) gets no heartbeat: one would re-create its hash.
-- Its own keys are removed instead, so none outlives it by more than a beat
-- of a sidecar that served it. Nor is the group re-created here: only a
-- Consume call re-creates a lost group (the worker, on its next read).
--
-- KEYS[1]  the stream
-- KEYS[2]  the group's heartbeat hash: consumer → Redis time (unix ms) of its last beat
-- KEYS[3…] the group's other own keys (its retry hash, its keyed entries), removed with KEYS[2]
--          when the group is gone (`Keyspace::group_keys`); KEYS[4] is the keyed entries
--
-- Each beat also samples the group's keyed entries (per-key limits) and
-- removes members whose entry the group no longer has pending: left behind
-- when an entry left the PEL some way no sidecar script saw (acknowledged by
-- another client, deleted, the key field changed), they would mark a key
-- busy until its next entry met the gate. The gate (key_gate.lua, prepended)
-- removes them too, but only for keys that get another entry.
-- ARGV[1]  the group
-- ARGV[2]  this sidecar's consumer (never removed)
-- ARGV[3]  the idle limit, milliseconds; 0: only record the heartbeat
-- ARGV[4]  how recent a heartbeat is to count its sidecar as serving the group, milliseconds
-- ARGV[5]  1: a thorough beat (dead consumers removed, stale heartbeats dropped,
--          the hash's expiry renewed); 0: a light one
-- Returns {the sidecars serving the group (fresh heartbeats, this one's
-- included), the names removed}; false (nil) when the stream does not exist;
-- the number of the group's keys removed (an integer) when the stream exists
-- without the group.

local stream, beats, group, me = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local limit = tonumber(ARGV[3])
local function remove_own_keys()
  return redis.call('DEL', unpack(KEYS, 2))
end
local thorough = ARGV[5] == '1'
-- XINFO CONSUMERS on a thorough beat, else XPENDING of no entries: either
-- fails when the group or its stream is gone. A stream deleted (DEL,
-- FLUSHALL, a restart without persistence) took its group and consumers
-- with it: nothing to beat for. Say so, and record no heartbeat that would
-- outlive it.
local consumers
if thorough then
  consumers = redis.pcall('XINFO', 'CONSUMERS', stream, group)
else
  consumers = redis.pcall('XPENDING', stream, group, '-', '+', 0)
end
if type(consumers) == 'table' and consumers.err then
  if redis.call('EXISTS', stream) == 0 then
    remove_own_keys()
    return false
  end
  if string.find(consumers.err, 'NOGROUP', 1, true) then
    return remove_own_keys()
  end
  return redis.error_reply(consumers.err)
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('HSET', beats, me, now)
if thorough then
  -- The hash outlives no group for long: a day, or twice the limit if longer.
  redis.call('PEXPIRE', beats, math.max(86400000, 2 * limit))
end
-- How many sidecars serve the group: with `--shared-readers auto` each
-- chooses by it whether its reader shares or blocks.
local fresh, sidecars = tonumber(ARGV[4]), 0
for _, beat in ipairs(redis.call('HVALS', beats)) do
  local at = tonumber(beat)
  if at and now - at <= fresh then
    sidecars = sidecars + 1
  end
end
-- A random sample: no cursor to keep, and every stale member is met within
-- a few beats for sets of hundreds; a member not shaped as the sidecars
-- write them (by hand) is left alone.
local keyed = KEYS[4]
if keyed and redis.call('TYPE', keyed).ok == 'zset' then
  for _, member in ipairs(redis.call('ZRANDMEMBER', keyed, 32)) do
    if #member > 41 and string.match(string.sub(member, -41), '^%d+%-%d+$') then
      local id = id_of_member(member)
      if #redis.call('XPENDING', stream, group, id, id, 1) == 0 then
        redis.call('ZREM', keyed, member)
      end
    end
  end
end
local removed = {}
if limit == 0 or not thorough then
  return {sidecars, removed}
end
local present = {}
for _, consumer in ipairs(consumers) do
  local info = {}
  for i = 1, #consumer, 2 do
    info[consumer[i]] = consumer[i + 1]
  end
  local name = info['name']
  present[name] = true
  local beat = tonumber(redis.call('HGET', beats, name))
  local beating = beat ~= nil and now - beat <= limit
  if name ~= me and info['pending'] == 0 and info['idle'] > limit and not beating then
    redis.call('XGROUP', 'DELCONSUMER', stream, group, name)
    redis.call('HDEL', beats, name)
    removed[#removed + 1] = name
  end
end
-- Heartbeats of consumers gone from the group some other way, stale past the limit.
local fields = redis.call('HGETALL', beats)
for i = 1, #fields, 2 do
  if not present[fields[i]] and now - tonumber(fields[i + 1]) > limit then
    redis.call('HDEL', beats, fields[i])
  end
end
return {sidecars, removed}
