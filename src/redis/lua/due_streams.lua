-- The streams whose schedules are due, from the sidecars' index of streams
-- with scheduled entries, by Redis time (so a sidecar's own clock does not
-- matter).
--
-- KEYS[1]  the index (`echomq:scheduled-index`: stream key by the unix ms its
--          earliest scheduled entry is due at, or earlier)
-- ARGV[1]  the most streams to return
-- Returns { a flat list { stream key, due unix ms (text), … } of the due
-- streams, earliest first; how many ms until the index's earliest due time
-- (0 when one is due, -1 when the index is empty) }: an idle mover sleeps
-- that long, measured on the Redis clock so the sidecar's does not matter.

local now = redis.call('TIME')
local clock = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', clock, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = -1
if #first == 2 then
  wait = math.max(0, tonumber(first[2]) - clock)
end
return { due, wait }
