-- Trims a stream with XTRIM MINID, in the safe mode never past an entry that a
-- group still has pending or has not yet been delivered. Computed and applied
-- in one script, so no group can move in between.
--
-- KEYS[1]  the stream
-- ARGV[1]  keep at least the newest N entries ('' : no such bound)
-- ARGV[2]  remove the ids below this one, `<ms>-<seq>` ('' : no such bound)
-- ARGV[3]  '1' for MINID ~ (whole nodes only), '0' for exact
-- ARGV[4]  '1' to ignore groups (unsafe), '0' for the safe mode
-- ARGV[5]  with an archive: the fold lease's token, which KEYS[2] must still
--          hold (else ECHOMQ_FENCED and nothing is trimmed); '' without one
-- ARGV[6]  '1' for a dry run: the bound only, nothing trimmed
-- ARGV[7]  with an archive: its archived_through id, recorded in KEYS[3]
--          (never moved back) before anything is trimmed, and past which the
--          bound never goes ('' : the archive holds nothing, so nothing is
--          trimmed)
-- KEYS[2]  the fold lease (KEYS[1] again without an archive)
-- KEYS[3]  where the archive ends (`<stream>:archive:through`): every entry
--          trimmed into the archive is at or below it, which lets a Read after
--          it skip the archive. Without an archive, its existence refuses the
--          trim (ECHOMQ_ARCHIVED): another sidecar archives this stream, and
--          this one would remove entries it never archived
-- The caller gives one bound; with both, the one that removes less wins.
-- Returns { trimmed, applied min id or '', held back by groups 1/0, lost },
-- lost as trim_counting_unread gives it (empty in the safe mode).

local stream = KEYS[1]
if ARGV[6] ~= '1' and ARGV[5] ~= '' then
  if redis.call('GET', KEYS[2]) ~= ARGV[5] then
    return redis.error_reply('ECHOMQ_FENCED another sidecar holds the fold lease of ' .. stream)
  end
  if ARGV[7] ~= '' then
    local through = redis.call('GET', KEYS[3])
    -- A value that is no id (set by hand) is replaced, not compared.
    if not through or not string.match(through, '^%d+%-%d+$') or id_less(through, ARGV[7]) then
      redis.call('SET', KEYS[3], ARGV[7])
    end
  end
end
if ARGV[6] ~= '1' and ARGV[5] == '' and redis.call('EXISTS', KEYS[3]) == 1 then
  return redis.error_reply('ECHOMQ_ARCHIVED ' .. stream .. ' is archived')
end
if redis.call('EXISTS', stream) == 0 then
  return { 0, '', 0, {} }
end
-- Raises WRONGTYPE for another type.
redis.call('XLEN', stream)

local function parse(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return ms, seq
end

-- The id right after `id`; past 2^53 the next millisecond is used (still
-- after `id`, and no entry can sit in between).
local function successor(id)
  local ms, seq = parse(id)
  if #seq > 15 then
    return string.format('%d-0', tonumber(ms) + 1)
  end
  return ms .. '-' .. string.format('%d', tonumber(seq) + 1)
end

local target = '0-0'
if ARGV[1] ~= '' then
  -- The oldest id kept, read from whichever end is nearer.
  local keep, length = tonumber(ARGV[1]), redis.call('XLEN', stream)
  if length == 0 or length <= keep then
    return { 0, '', 0, {} }
  elseif keep == 0 then
    target = successor(redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1][1])
  elseif keep <= length - keep then
    local newest = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', keep)
    target = newest[#newest][1]
  else
    local oldest = redis.call('XRANGE', stream, '-', '+', 'COUNT', length - keep + 1)
    target = oldest[#oldest][1]
  end
end
if ARGV[2] ~= '' and (ARGV[1] == '' or id_less(ARGV[2], target)) then
  target = ARGV[2]
end

local applied, held_back = target, 0
if ARGV[4] ~= '1' then
  local groups = redis.call('XINFO', 'GROUPS', stream)
  for _, group in ipairs(groups) do
    local info = {}
    for i = 1, #group, 2 do
      info[group[i]] = group[i + 1]
    end
    local bound = successor(info['last-delivered-id'])
    if tonumber(info['pending']) > 0 then
      local summary = redis.call('XPENDING', stream, info['name'])
      if summary[2] and id_less(summary[2], bound) then
        bound = summary[2]
      end
    end
    if id_less(bound, applied) then
      applied, held_back = bound, 1
    end
  end
end

if ARGV[5] ~= '' then
  -- The first id not archived.
  local unarchived = '0-0'
  if ARGV[7] ~= '' then
    unarchived = successor(ARGV[7])
  end
  if id_less(unarchived, applied) then
    applied = unarchived
  end
end
if ARGV[6] == '1' then
  return { 0, applied, held_back, {} }
end
local xtrim = { 'MINID', applied }
if ARGV[3] == '1' then
  xtrim = { 'MINID', '~', applied }
end
if ARGV[4] ~= '1' then
  -- The safe bound keeps every entry a group has not been delivered.
  return { redis.call('XTRIM', stream, unpack(xtrim)), applied, held_back, {} }
end
local trimmed, lost = trim_counting_unread(stream, xtrim, nil)
return { trimmed, applied, held_back, lost }
