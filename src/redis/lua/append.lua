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
-- ARGV[5]  the number of entries; then, per entry, its field count m followed
--          by m name/value pairs
-- Returns { the stream ids in order, lost }, lost as trim_counting_unread
-- gives it (the groups whose unread entries the cap removed).
--
-- Why a script: the branded id is the stream id the entry gets, and it must be
-- written inside the entry. The script picks the id itself (Redis time, after
-- the stream's last generated id, as XADD * would) and passes it explicitly to
-- XADD, so the id and the field agree and no other writer can slip in between.

local stream = KEYS[1]
local max_branded_ms = 281474976710655 -- 2^48 - 1: the 6 bytes of a branded id

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
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local seq = shard

if redis.call('EXISTS', stream) == 1 then
  -- Raises WRONGTYPE when the key is not a stream.
  local info = redis.call('XINFO', 'STREAM', stream)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      local last_ms, last_seq = string.match(info[i + 1], '^(%d+)%-(%d+)$')
      local last = tonumber(last_ms)
      if last >= ms then
        -- Sequences past 2^53 lose precision as Lua numbers: move to the next millisecond.
        if #last_seq > 15 then
          ms, seq = last + 1, shard
        else
          -- The first sequence after the last one that is this shard's.
          local next = tonumber(last_seq) + 1
          ms, seq = last, next + (shard - next) % shards
        end
      end
      break
    end
  end
end

local trim = tonumber(ARGV[2])
local ids = {}
local arg = 6
for entry = 1, tonumber(ARGV[5]) do
  if ms > max_branded_ms then
    return redis.error_reply('ERR echomq: the stream id would exceed the branded id range (milliseconds past 2^48)')
  end
  local id = string.format('%d-%d', ms, seq)
  local command = { 'XADD', stream, id }
  command[#command + 1] = ARGV[1]
  command[#command + 1] = branded_text(ms, seq)
  local fields = tonumber(ARGV[arg])
  for i = arg + 1, arg + 2 * fields do
    command[#command + 1] = ARGV[i]
  end
  arg = arg + 1 + 2 * fields
  redis.call(unpack(command))
  ids[entry] = id
  seq = seq + shards
end
-- The cap once, after the batch, as XADD's MAXLEN ~ would leave it, counting
-- what it removed before a group read it.
local lost = {}
if trim > 0 then
  local excess = redis.call('XLEN', stream) - trim
  if excess > 0 then
    local _
    _, lost = trim_counting_unread(stream, { 'MAXLEN', '~', ARGV[2] }, excess)
  end
end
return { ids, lost }
