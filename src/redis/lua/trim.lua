-- Trims a stream with XTRIM MINID, in the safe mode never past an entry that a
-- group still has pending or has not yet been delivered. Computed and applied
-- in one script, so no group can move in between.
--
-- KEYS[1]  the stream
-- ARGV[1]  keep at least the newest N entries ('' : no such bound)
-- ARGV[2]  remove the ids below this one, `<ms>-<seq>` ('' : no such bound)
-- ARGV[3]  '1' for MINID ~ (whole nodes only), '0' for exact
-- ARGV[4]  '1' to ignore groups (unsafe), '0' for the safe mode
-- The caller gives one bound; with both, the one that removes less wins.
-- Returns { trimmed, applied min id or '', held back by groups 1/0 }.

local stream = KEYS[1]
if redis.call('EXISTS', stream) == 0 then
  return { 0, '', 0 }
end
-- Raises WRONGTYPE for another type.
redis.call('XLEN', stream)

local function parse(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return ms, seq
end

-- Compares decimal strings of any length as numbers.
local function less_number(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

local function less(a, b)
  local a_ms, a_seq = parse(a)
  local b_ms, b_seq = parse(b)
  if a_ms ~= b_ms then
    return less_number(a_ms, b_ms)
  end
  return less_number(a_seq, b_seq)
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
  local keep = tonumber(ARGV[1])
  local newest = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', math.max(keep, 1))
  if keep == 0 and #newest == 1 then
    target = successor(newest[1][1])
  elseif keep == 0 or #newest < keep then
    return { 0, '', 0 }
  else
    target = newest[#newest][1]
  end
end
if ARGV[2] ~= '' and (ARGV[1] == '' or less(ARGV[2], target)) then
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
      if summary[2] and less(summary[2], bound) then
        bound = summary[2]
      end
    end
    if less(bound, applied) then
      applied, held_back = bound, 1
    end
  end
end

local trimmed
if ARGV[3] == '1' then
  trimmed = redis.call('XTRIM', stream, 'MINID', '~', applied)
else
  trimmed = redis.call('XTRIM', stream, 'MINID', applied)
end
return { trimmed, applied, held_back }
