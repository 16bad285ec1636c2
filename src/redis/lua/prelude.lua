-- Prepended to every script when it is loaded (redis::Scripts), so each rule
-- the Rust side also knows is written once here; `tests/scripts.rs` checks
-- that both sides agree.

-- The hex digits of a decimal number given as text, exact beyond 2^53 (Lua's
-- numbers are doubles), padded with zeros to `width`.
local function decimal_to_hex(text, width)
  local digits = {}
  for d in string.gmatch(text, '%d') do
    digits[#digits + 1] = tonumber(d)
  end
  local out = ''
  repeat
    local rest, quotient = 0, {}
    for i = 1, #digits do
      local value = rest * 10 + digits[i]
      local q = math.floor(value / 16)
      rest = value % 16
      if q > 0 or #quotient > 0 then
        quotient[#quotient + 1] = q
      end
    end
    out = string.sub('0123456789abcdef', rest + 1, rest + 1) .. out
    digits = quotient
  until #digits == 0
  return string.rep('0', width - #out) .. out
end

-- The branded id's text of `ms` and `seq` (numbers below 2^53): 12 hex
-- digits of milliseconds, 16 of sequence (id::BrandedId's Display).
local function branded_text(ms, seq)
  return string.format('%012x%016x', ms, seq)
end

-- The branded id derived from a stream id `<ms>-<seq>` given as text, as
-- id::BrandedId::from_stream_id derives it.
local function branded_of_stream_id(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return decimal_to_hex(ms, 12) .. decimal_to_hex(seq, 16)
end

-- Whether `text` is a branded id's text form: 28 lowercase hex characters
-- (id::BrandedId's FromStr).
local function is_branded_text(text)
  return #text == 28 and string.match(text, '^[0-9a-f]+$') ~= nil
end

-- Whether `text` is a shard count as sidecars record it: 1 to 1024 in plain
-- decimal (keys::is_recorded_count).
local function is_recorded_count(text)
  return string.match(text, '^[1-9]%d?%d?%d?$') ~= nil and tonumber(text) <= 1024
end
