-- Appends entries to one stream and mints each one's branded id, atomically.
--
-- KEYS[1]  the stream
-- KEYS[2]  the key that would record a shard count for a sharded stream of
--          this name, or KEYS[1] again when no sharded stream can have it:
--          when it holds a count, this sidecar was not started with that
--          sharded stream, and the append is refused with
--          `ECHOMQ_SHARDED <count>` (its entries would land in a key no shard
--          consumer reads)
-- KEYS[3]  where the stream's archive ends (`<stream>:archive:through`), or
--          KEYS[1] again when max_len is 0: with a max_len, its existence
--          refuses the append (ECHOMQ_ARCHIVED), since the cap would remove
--          entries a sidecar archives before anything could archive them
-- ARGV[1]  the reserved field that carries the branded id
-- ARGV[2]  max_len: 0 for no trimming, else XTRIM MAXLEN ~ max_len after the
--          entries are added
-- ARGV[3]  the shard's index k and ARGV[4] the shard count n (0 and 1 for a
--          plain stream): every sequence number minted is k modulo n, so the
--          shards of one sharded stream never mint the same id
-- KEYS[4]  the stream's schedule (`<stream>:scheduled`, a sorted set: branded
--          id by due unix ms) and KEYS[5] its entries (`<stream>:scheduled:entries`,
--          a hash: branded id → encode_fields of its fields; and `shard` →
--          `<k> <n>`, the stride move.lua mints with)
-- KEYS[6…] the dedup records of the entries that have a dedup key
--          (`<stream>:dedup:<key>`, keys::Keyspace::dedup), each once
-- ARGV[5]  the dedup window (ms): how long a record set here lives (PX)
-- ARGV[6]  1 when the caller will WAIT for replicas after this script, else 0:
--          a duplicate then rewrites its record (SET … KEEPTTL), so this
--          connection's replication offset covers the first append too, and
--          the WAIT confirms it even on a connection that did not write it
-- ARGV[7]  the number of entries; then, per entry, the index in KEYS of its
--          dedup record (0: none), when it is due (unix ms; 0: now), how long
--          after the Redis time now it is due (ms; 0: now), its field count m,
--          and m name/value pairs
-- Returns { the stream ids in order, lost, duplicates, scheduled }: lost as
-- trim_counting_unread gives it (the groups whose unread entries the cap
-- removed); duplicates a flat list { entry number (1-based), branded id, … }
-- of the entries not written because their dedup record exists (or an
-- earlier entry of this batch has the same record): their stream id in the
-- list is the recorded one, or '' when the recorded append was scheduled;
-- scheduled a flat list { entry number, branded id, due unix ms, … } of the
-- entries scheduled (their stream id in the list is '').
--
-- A scheduled entry (due after the Redis time now) is minted its branded id
-- here as if it were appended, and the stream's last generated id is set to
-- it (XSETID), so no later XADD can take it: the id stays unique in the
-- stream for good, and move.lua writes the entry, with that id in the field,
-- when it is due. An absent stream is created empty first (a group created
-- with MKSTREAM and destroyed: no entry added and deleted, so no tombstone
-- that Redis 7 would count against group lag).
--
-- Why a script: the branded id is the stream id the entry gets, and it must be
-- written inside the entry. The script picks the id itself (Redis time, after
-- the stream's last generated id, as XADD * would) and passes it explicitly to
-- XADD, so the id and the field agree and no other writer can slip in between.
-- The dedup check, the XADD and the record are one step for the same reason:
-- two appends with one dedup key can never both write.

local stream = KEYS[1]

local shard, shards = tonumber(ARGV[3]), tonumber(ARGV[4])
if KEYS[2] ~= stream and redis.call('TYPE', KEYS[2]).ok == 'string' then
  local recorded = redis.call('GET', KEYS[2])
  if is_recorded_count(recorded) then
    return redis.error_reply('ECHOMQ_SHARDED ' .. recorded)
  end
end
if tonumber(ARGV[2]) > 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  return redis.error_reply('ECHOMQ_ARCHIVED ' .. stream .. ' is archived')
end
local ms, seq, clock = next_stream_id(stream, shard, shards)

local trim = tonumber(ARGV[2])
local window, waited = ARGV[5], ARGV[6] == '1'
local ids, duplicates = {}, {}
-- Dedup record index → { stream id, branded id } of this batch's first entry with it.
local recorded = {}
local scheduled = {}
local written = 0
-- The last id minted for a scheduled entry, while no XADD came after it.
local reserved = nil
local arg = 8
for entry = 1, tonumber(ARGV[7]) do
  local record = tonumber(ARGV[arg])
  local at, after = tonumber(ARGV[arg + 1]), tonumber(ARGV[arg + 2])
  local fields = tonumber(ARGV[arg + 3])
  local first = arg + 4
  arg = first + 2 * fields
  local due = 0
  if at > 0 then
    due = at
  elseif after > 0 then
    due = clock + after
  end
  local seen = nil
  if record > 0 then
    seen = recorded[record]
    if seen == nil then
      -- `<stream id> <branded id>`; raises WRONGTYPE when the key is not a string.
      local value = redis.call('GET', KEYS[record])
      if value then
        local sid, branded = string.match(value, '^(%S+) (%S+)$')
        if sid == 'scheduled' then
          sid = ''
        end
        if sid then
          seen = { sid, branded }
          recorded[record] = seen
          if waited then
            redis.call('SET', KEYS[record], value, 'KEEPTTL')
          end
        end
      end
    end
  end
  if seen ~= nil then
    ids[entry] = seen[1]
    duplicates[#duplicates + 1] = entry
    duplicates[#duplicates + 1] = seen[2]
  else
    if ms > MAX_BRANDED_MS then
      return redis.error_reply('ERR echomq: the stream id would exceed the branded id range (milliseconds past 2^48)')
    end
    local id = string.format('%d-%d', ms, seq)
    local branded = branded_text(ms, seq)
    if due > clock then
      redis.call('ZADD', KEYS[4], due, branded)
      redis.call('HSET', KEYS[5], branded, encode_fields(first, fields), 'shard', shard .. ' ' .. shards)
      id = ''
      scheduled[#scheduled + 1] = entry
      scheduled[#scheduled + 1] = branded
      scheduled[#scheduled + 1] = due
      reserved = string.format('%d-%d', ms, seq)
    else
      local command = { 'XADD', stream, id, ARGV[1], branded }
      for i = first, first + 2 * fields - 1 do
        command[#command + 1] = ARGV[i]
      end
      redis.call(unpack(command))
      written = written + 1
      reserved = nil
    end
    if record > 0 then
      local recorded_id = id
      if id == '' then
        recorded_id = 'scheduled'
      end
      redis.call('SET', KEYS[record], recorded_id .. ' ' .. branded, 'PX', window)
      recorded[record] = { id, branded }
    end
    ids[entry] = id
    seq = seq + shards
  end
end
if reserved ~= nil then
  if redis.call('EXISTS', stream) == 0 then
    redis.call('XGROUP', 'CREATE', stream, 'echomq:reserving', '$', 'MKSTREAM')
    redis.call('XGROUP', 'DESTROY', stream, 'echomq:reserving')
  end
  redis.call('XSETID', stream, reserved)
end
-- The cap once, after the batch, as XADD's MAXLEN ~ would leave it, counting
-- what it removed before a group read it. A batch of duplicates only wrote
-- nothing, and trims nothing either.
local lost = {}
if trim > 0 and written > 0 then
  local excess = redis.call('XLEN', stream) - trim
  if excess > 0 then
    local _
    _, lost = trim_counting_unread(stream, { 'MAXLEN', '~', ARGV[2] }, excess)
  end
end
return { ids, lost, duplicates, scheduled }
