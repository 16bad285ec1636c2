-- The streams whose schedules are due, from the sidecars' index of streams
-- with scheduled entries, by Redis time (so a sidecar's own clock does not
-- matter).
--
-- KEYS[1]  the index (`echomq:scheduled-index`: stream key by the unix ms its
--          earliest scheduled entry is due at, or earlier)
-- ARGV[1]  the most streams to return
-- Returns a flat list { stream key, due unix ms (text), … }, earliest first.

local now = redis.call('TIME')
local clock = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', clock, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
