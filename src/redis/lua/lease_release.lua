-- Gives the archive's fold lease up while this sidecar still holds it, so the
-- next fold of the stream need not wait for it to expire.
--
-- KEYS[1]  the fold lease (`<stream>:archive:lease`)
-- ARGV[1]  the token this sidecar wrote there (SET NX PX)
-- Returns 1 when released, 0 when another sidecar's token (or none) is there.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
