-- Removes a group's consumers that are dead and hold nothing: idle longer
-- than the limit and with no pending entries. A consumer with pending entries
-- is never removed (XGROUP DELCONSUMER would drop its PEL and lose them), and
-- the check and the removal happen in one script, so nothing can be delivered
-- to it in between.
--
-- KEYS[1]  the stream
-- ARGV[1]  the group
-- ARGV[2]  this sidecar's consumer (never removed)
-- ARGV[3]  the idle limit, milliseconds
-- Returns the names removed.

local removed = {}
for _, consumer in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for i = 1, #consumer, 2 do
    info[consumer[i]] = consumer[i + 1]
  end
  if info['name'] ~= ARGV[2] and info['pending'] == 0 and info['idle'] > tonumber(ARGV[3]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    removed[#removed + 1] = info['name']
  end
end
return removed
