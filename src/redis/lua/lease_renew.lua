-- Extends the archive's fold lease while this sidecar still holds it.
--
-- KEYS[1]  the fold lease (`<stream>:archive:lease`)
-- ARGV[1]  the token this sidecar wrote there (SET NX PX)
-- ARGV[2]  the new time to live (ms)
-- Returns 1 when renewed, 0 when another sidecar's token (or none) is there.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
