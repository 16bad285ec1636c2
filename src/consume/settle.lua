-- Applies a batch of verdicts in one round trip and one command: record the
-- retry state of newly failed entries, XACK the acknowledged entries, and
-- drop the retry state of those that had any.
--
-- The acks go to Redis as multi-id XACKs of up to `chunk` ids each, not one
-- nested XACK per id: a nested call costs Redis ~1.5 µs per id in argument
-- objects, command lookup and reply conversion, against ~0.5 µs per id inside
-- one XACK (measured on 7.0.15: EVALSHA 2.4 µs per acked entry with per-id
-- calls; a direct consumer's multi-id XACK 0.54). A multi-id XACK answers one
-- count per chunk: all pending (the count is the chunk's size) and none (0)
-- are exact; a count in between cannot say which ids were no longer pending,
-- and the caller reports the shortfall by number (see settle.rs). A non-
-- destructive check first (XPENDING over the range) measured slower than the
-- per-id calls, and once XACKed an entry cannot be asked about again.
--
-- XACK settles the entry for the group, whichever consumer's PEL holds it: an
-- Ack that crosses a peer's reclaim (before this sidecar's lease refresh
-- notices, at most a third of the reclaim min-idle) still applies. That is
-- the right outcome, as the handler finished the entry; the peer's own
-- verdict is then answered NOT_PENDING. Checking the PEL first would cost an
-- XPENDING per ack on the hottest path.
--
-- KEYS[1]  the stream
-- KEYS[2]  the group's retry hash: stream id → "<due unix ms> <reason>"
-- KEYS[3]  the group's keyed entries (`<stream>:keys:<group>`, per-key limits)
-- ARGV[1]  the group
-- ARGV[2]  chunk, the most ids (or pairs) per command (unpack's stack bounds it)
-- ARGV[3]  a, the number of entries to acknowledge; then a stream ids
-- then     c, the number of retry states to drop; then c stream ids
-- then     w, the number of retry states to write; then w (stream id, state) pairs
-- then     k, the number of keyed members to remove (the acknowledged entries
--          that have a key: they leave the PEL here, so their key frees);
--          then k members
-- Returns, per chunk of acknowledged ids in order, how many were pending.

local stream, retries, keyed, group = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local chunk = tonumber(ARGV[2])
local acks_at = 3
local acks = tonumber(ARGV[acks_at])
local clears_at = acks_at + acks + 1
local clears = tonumber(ARGV[clears_at])
local writes_at = clears_at + clears + 1
local writes = tonumber(ARGV[writes_at])
local members_at = writes_at + 2 * writes + 1
local members = tonumber(ARGV[members_at] or '0')

-- Runs `command key extra… ARGV[first .. first + count * width - 1]` in
-- commands of at most `chunk` items of `width` arguments; returns the replies.
local function chunked(command, key, extra, first, count, width)
  local replies = {}
  local done = 0
  while done < count do
    local n = math.min(chunk, count - done)
    local from = first + done * width
    if extra then
      replies[#replies + 1] = redis.call(command, key, extra, unpack(ARGV, from, from + n * width - 1))
    else
      replies[#replies + 1] = redis.call(command, key, unpack(ARGV, from, from + n * width - 1))
    end
    done = done + n
  end
  return replies
end

-- Retry states first: one written for an entry whose ack deadline passed,
-- then delivered again and acknowledged within the same batch, is older than
-- that ack, whose HDEL must win.
chunked('HSET', retries, nil, writes_at + 1, writes, 2)
local pending = chunked('XACK', stream, group, acks_at + 1, acks, 1)
chunked('HDEL', retries, nil, clears_at + 1, clears, 1)
chunked('ZREM', keyed, nil, members_at + 1, members, 1)
return pending
