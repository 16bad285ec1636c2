-- A page of a stream's scheduled entries, by due time then branded id (the
-- sorted set's own order: equal scores sort by member, and branded ids are
-- fixed-width hex).
--
-- KEYS[1]  the stream's schedule (`<stream>:scheduled`)
-- KEYS[2]  its scheduled entries (`<stream>:scheduled:entries`)
-- ARGV[1]  continue after this due unix ms and ARGV[2] this branded id (''
--          and '': from the first)
-- ARGV[3]  the most entries to return
-- Returns { total, entries }: total the schedule's size (ZCARD); entries a
-- list of { branded id, due unix ms (text), { name, value, … } }, at most
-- ARGV[3] + 1 of them (one more tells the caller another page follows).

local schedule, entries = KEYS[1], KEYS[2]
local after_due, after_id = ARGV[1], ARGV[2]
local want = tonumber(ARGV[3]) + 1
local min = '-inf'
if after_due ~= '' then
  min = after_due
end
local out = {}
local offset = 0
while #out < want do
  local page = redis.call('ZRANGEBYSCORE', schedule, min, '+inf', 'WITHSCORES', 'LIMIT', offset, 1000)
  if #page == 0 then
    break
  end
  offset = offset + #page / 2
  for i = 1, #page, 2 do
    local branded, due = page[i], page[i + 1]
    if after_due == '' or tonumber(due) > tonumber(after_due) or branded > after_id then
      local encoded = redis.call('HGET', entries, branded) or ''
      out[#out + 1] = { branded, due, decode_fields(encoded) }
      if #out == want then
        break
      end
    end
  end
end
return { redis.call('ZCARD', schedule), out }
