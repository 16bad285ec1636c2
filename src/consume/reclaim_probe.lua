-- The reclaim beat's probe, one run for many groups of a sidecar: which of
-- them have an entry a reclaim would take (pending and idle at least the
-- reclaim's min-idle), so that only those run XAUTOCLAIM. Idle, a sidecar
-- serving a thousand groups sends one of these per beat instead of a
-- thousand XAUTOCLAIMs.
--
-- Not on a Redis Cluster: a script's keys must share a slot, and a sidecar's
-- groups seldom do; there each group's worker runs its own beat.
--
-- KEYS[i]    the stream of group i
-- ARGV[1]    min-idle, milliseconds (`--reclaim-min-idle-ms`)
-- ARGV[1+i]  group i
-- Returns the positions (1-based) of the groups to reclaim: those with such
-- an entry, and those whose probe failed (the group or its stream is gone, a
-- key of another type): the worker's own XAUTOCLAIM then meets the error
-- and recovers as it always did (NOGROUP re-creates the group).

local min_idle = ARGV[1]
local due = {}
for i, stream in ipairs(KEYS) do
  local idle = redis.pcall('XPENDING', stream, ARGV[1 + i], 'IDLE', min_idle, '-', '+', 1)
  if idle['err'] or #idle > 0 then
    due[#due + 1] = i
  end
end
return due
