-- Destroys a consumer group and every key the sidecars keep for it alone, in
-- one step: no beat or verdict can write one of them between the XGROUP
-- DESTROY and the DEL (all are in the stream's slot: `Keyspace::group_keys`).
--
-- KEYS[1]   the stream
-- KEYS[2…]  the group's own keys (its heartbeat hash, its retry hash, its keyed entries)
-- ARGV[1]   the group
-- ARGV[2]   '1': destroy even with pending entries; '0': refuse then
-- ARGV[3]   '1': only check (nothing is changed); '0': destroy
--
-- Replies:
--   { 'missing', removed }     no such group (or no stream); its leftover
--                              keys were removed (none when only checking)
--   { 'pending', pending }     it has pending entries and ARGV[2] is '0':
--                              nothing was changed
--   { 'checked', pending }     ARGV[3] is '1' and it could be destroyed
--   { 'destroyed', pending, removed }
-- A key that is not a stream fails with WRONGTYPE, changing nothing.

local stream, group = KEYS[1], ARGV[1]
local force, check = ARGV[2] == '1', ARGV[3] == '1'

local function remove_own_keys()
  if check or #KEYS < 2 then
    return 0
  end
  return redis.call('DEL', unpack(KEYS, 2))
end

local pending = nil
if redis.call('EXISTS', stream) == 1 then
  for _, info in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local fields = {}
    for i = 1, #info, 2 do
      fields[info[i]] = info[i + 1]
    end
    if fields['name'] == group then
      pending = fields['pending']
    end
  end
end
if pending == nil then
  return { 'missing', remove_own_keys() }
end
if pending > 0 and not force then
  return { 'pending', pending }
end
if check then
  return { 'checked', pending }
end
redis.call('XGROUP', 'DESTROY', stream, group)
return { 'destroyed', pending, remove_own_keys() }
