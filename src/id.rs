//! Stream ids and branded ids.
//!
//! A stream id is Redis's `<ms>-<seq>`. A branded id is the same pair packed
//! into 14 bytes (6 bytes of unix milliseconds, 8 bytes of sequence, both
//! big-endian) and written as 28 lowercase hex characters, so text order, byte
//! order and stream order agree. The branded id of an entry is the stream id it
//! got in the stream it was first appended to; copies keep it.

use std::{fmt, str::FromStr};

/// The largest millisecond value a branded id can hold (6 bytes).
pub const MAX_BRANDED_MS: u64 = (1 << 48) - 1;

/// Length of a branded id's text form, in characters.
pub const BRANDED_ID_LEN: usize = 28;

/// A Redis stream id, `<ms>-<seq>`. Ordered as Redis orders entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId {
    /// Unix milliseconds (or whatever the producer put there with an explicit id).
    pub ms: u64,
    /// Sequence within the millisecond.
    pub seq: u64,
}

impl StreamId {
    /// The smallest id, `0-0`.
    pub const ZERO: StreamId = StreamId { ms: 0, seq: 0 };

    /// The largest id, `18446744073709551615-18446744073709551615`.
    pub const MAX: StreamId = StreamId { ms: u64::MAX, seq: u64::MAX };

    /// The id just after this one; `None` for [`StreamId::MAX`].
    pub fn successor(self) -> Option<StreamId> {
        match (self.ms, self.seq) {
            (u64::MAX, u64::MAX) => None,
            (ms, u64::MAX) => Some(StreamId { ms: ms + 1, seq: 0 }),
            (ms, seq) => Some(StreamId { ms, seq: seq + 1 }),
        }
    }

    /// The id just before this one, for Redis's inclusive range bounds; `None` for `0-0`.
    pub fn predecessor(self) -> Option<StreamId> {
        match (self.ms, self.seq) {
            (0, 0) => None,
            (ms, 0) => Some(StreamId { ms: ms - 1, seq: u64::MAX }),
            (ms, seq) => Some(StreamId { ms, seq: seq - 1 }),
        }
    }
}

/// "00", "01", … "99": decimal digits two at a time.
const DIGIT_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

impl StreamId {
    /// Writes `<ms>-<seq>` into `buf` (two u64 in decimal, 20 digits at most
    /// each, and the dash) and returns the ASCII text's bytes: no allocation,
    /// and no UTF-8 check (a delivery's frame and a command take bytes).
    pub fn write_ascii(self, buf: &mut [u8; 41]) -> &[u8] {
        let mut at = buf.len();
        for (k, mut n) in [self.seq, self.ms].into_iter().enumerate() {
            // Two digits a step: every delivery's stream id and every id
            // acknowledged are written here.
            while n >= 100 {
                let pair = (n % 100) as usize * 2;
                n /= 100;
                at -= 2;
                buf[at..at + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
            }
            if n >= 10 {
                let pair = n as usize * 2;
                at -= 2;
                buf[at..at + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
            } else {
                at -= 1;
                buf[at] = b'0' + n as u8;
            }
            if k == 0 {
                at -= 1;
                buf[at] = b'-';
            }
        }
        &buf[at..]
    }

    /// The decimal text's length (bytes): what [`StreamId::write_ascii`] writes.
    pub fn text_len(self) -> usize {
        let digits = |n: u64| n.checked_ilog10().map_or(1, |log| log as usize + 1);
        digits(self.ms) + 1 + digits(self.seq)
    }
}

// Both text forms are written into a stack buffer and handed to the formatter
// in one piece: every delivery carries both, and `write!` with numeric
// arguments cost a visible share of the delivery path in profiles.
impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only ASCII digits and the dash are written.
        f.write_str(std::str::from_utf8(self.write_ascii(&mut [0u8; 41])).map_err(|_| fmt::Error)?)
    }
}

// As a command argument, written from the stack: an XACK of a thousand ids
// allocates no string per id.
impl redis::ToRedisArgs for StreamId {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg(self.write_ascii(&mut [0u8; 41]));
    }
}

impl redis::ToSingleRedisArg for StreamId {}

/// Why a text is not an id. The message is meant for the person who sent it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct IdParseError(String);

impl StreamId {
    /// Parses `<ms>-<seq>`, or `<ms>` alone (sequence 0), as Redis accepts
    /// them, from bytes: `None` unless both are unsigned 64-bit decimals.
    /// (Ids in Redis replies are parsed here without a UTF-8 check or a
    /// `str::parse` each: they were a visible share of the delivery path.)
    pub fn parse_ascii(text: &[u8]) -> Option<StreamId> {
        let (ms, seq) = match text.iter().position(|&b| b == b'-') {
            Some(dash) => (&text[..dash], &text[dash + 1..]),
            None => (text, &b"0"[..]),
        };
        Some(StreamId { ms: decimal(ms)?, seq: decimal(seq)? })
    }
}

/// An unsigned 64-bit decimal of ASCII digits only (no sign, not empty);
/// `None` for anything else, including a value past `u64::MAX`. Shared with
/// the RESP parser's header numbers.
pub(crate) fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        let digit = b.wrapping_sub(b'0');
        (digit < 10).then_some(())?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

impl FromStr for StreamId {
    type Err = IdParseError;

    /// Parses `<ms>-<seq>`, or `<ms>` alone (sequence 0), as Redis accepts them.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        StreamId::parse_ascii(text.as_bytes()).ok_or_else(|| {
            IdParseError(format!(
                "`{text}` is not a stream id: expected `<ms>-<seq>` with two unsigned 64-bit integers"
            ))
        })
    }
}

/// The 14-byte identity of an entry, stable across copies: the idempotency key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BrandedId(StreamId);

impl BrandedId {
    /// The branded id of an entry first appended with this stream id; `None` when
    /// its milliseconds do not fit in 6 bytes (only explicit ids past the year 10889).
    pub fn from_stream_id(id: StreamId) -> Option<BrandedId> {
        (id.ms <= MAX_BRANDED_MS).then_some(BrandedId(id))
    }

    /// The stream id this branded id was minted as.
    pub fn minted_as(self) -> StreamId {
        self.0
    }

    /// The mint time, unix milliseconds.
    pub fn minted_at_ms(self) -> u64 {
        self.0.ms
    }

    /// The 14 bytes: 6 of milliseconds, 8 of sequence, big-endian.
    pub fn to_bytes(self) -> [u8; 14] {
        let mut bytes = [0u8; 14];
        bytes[..6].copy_from_slice(&self.0.ms.to_be_bytes()[2..]);
        bytes[6..].copy_from_slice(&self.0.seq.to_be_bytes());
        bytes
    }
}

impl BrandedId {
    /// Writes the 28 lowercase hex digits of [`BrandedId::to_bytes`] into
    /// `buf` and returns them: no allocation (every delivery carries them).
    pub fn write_ascii(self, buf: &mut [u8; BRANDED_ID_LEN]) -> &[u8; BRANDED_ID_LEN] {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for (k, byte) in self.to_bytes().into_iter().enumerate() {
            buf[2 * k] = HEX[usize::from(byte >> 4)];
            buf[2 * k + 1] = HEX[usize::from(byte & 0xf)];
        }
        buf
    }
}

impl fmt::Display for BrandedId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only hex digits are written.
        f.write_str(std::str::from_utf8(self.write_ascii(&mut [0u8; BRANDED_ID_LEN])).map_err(|_| fmt::Error)?)
    }
}

impl FromStr for BrandedId {
    type Err = IdParseError;

    /// Parses exactly 28 lowercase hex characters. Uppercase is refused so that
    /// one entry has one text form (the key a client deduplicates on).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        BrandedId::parse_ascii(text.as_bytes()).ok_or_else(|| {
            IdParseError(format!(
                "`{}` is not a branded id: expected 28 lowercase hex characters",
                text.chars().take(64).collect::<String>()
            ))
        })
    }
}

/// Marks a byte that is not a lowercase hex digit in [`HEX_VALUES`].
const NOT_HEX: u8 = 0x80;

/// Each byte's value as a lowercase hex digit, or [`NOT_HEX`].
const HEX_VALUES: [u8; 256] = {
    let mut values = [NOT_HEX; 256];
    let mut k = 0;
    while k < 16 {
        values[b"0123456789abcdef"[k] as usize] = k as u8;
        k += 1;
    }
    values
};

impl BrandedId {
    /// Parses exactly 28 lowercase hex characters from bytes (see
    /// [`FromStr`]); `None` for anything else. Every Ack's ids and every
    /// entry's reserved field are parsed here.
    pub fn parse_ascii(text: &[u8]) -> Option<BrandedId> {
        if text.len() != BRANDED_ID_LEN {
            return None;
        }
        let hex = |digits: &[u8]| {
            let mut n = 0u64;
            let mut invalid = 0u8;
            for &b in digits {
                let nibble = HEX_VALUES[usize::from(b)];
                invalid |= nibble;
                n = n << 4 | u64::from(nibble & 0xf);
            }
            // One check per id, not per character: NOT_HEX has the high bit.
            (invalid & NOT_HEX == 0).then_some(n)
        };
        Some(BrandedId(StreamId { ms: hex(&text[..12])?, seq: hex(&text[12..])? }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_is_28_hex_and_round_trips() {
        let id = BrandedId::from_stream_id(StreamId { ms: 1_718_000_000_000, seq: 3 }).unwrap();
        let text = id.to_string();
        assert_eq!(text, "019000c79c000000000000000003");
        assert_eq!(text.parse::<BrandedId>().unwrap(), id);
    }

    #[test]
    fn bytes_are_big_endian_ms_then_seq() {
        let id = BrandedId::from_stream_id(StreamId { ms: 0x0102_0304_0506, seq: 0x0708 }).unwrap();
        assert_eq!(id.to_bytes(), [1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0, 7, 8]);
    }

    #[test]
    fn text_order_equals_stream_order() {
        let ids = [
            StreamId { ms: 5, seq: u64::MAX },
            StreamId { ms: 6, seq: 0 },
            StreamId { ms: 6, seq: 10 },
            StreamId { ms: MAX_BRANDED_MS, seq: 0 },
        ];
        for pair in ids.windows(2) {
            let (a, b) = (BrandedId::from_stream_id(pair[0]).unwrap(), BrandedId::from_stream_id(pair[1]).unwrap());
            assert!(a.to_string() < b.to_string());
            assert!(a < b);
        }
    }

    #[test]
    fn text_forms_match_the_plain_formatting() {
        for (ms, seq) in [(0, 0), (1, 9), (10, 10), (1_718_000_000_000, 3), (MAX_BRANDED_MS, u64::MAX), (u64::MAX, 0)] {
            let id = StreamId { ms, seq };
            assert_eq!(id.to_string(), format!("{ms}-{seq}"));
            assert_eq!(id.to_string().parse::<StreamId>().unwrap(), id);
            if let Some(branded) = BrandedId::from_stream_id(id) {
                assert_eq!(branded.to_string(), format!("{ms:012x}{seq:016x}"));
                assert_eq!(branded.to_string().parse::<BrandedId>().unwrap(), branded);
            }
        }
    }

    #[test]
    fn refuses_uppercase_short_and_non_hex() {
        for bad in [
            "",
            "0",
            "019000C79C000000000000000003",
            "019000c79c00000000000000000g",
            "019000c79c0000000000000000000003",
        ] {
            assert!(bad.parse::<BrandedId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn stream_id_parses_redis_forms() {
        assert_eq!("5-3".parse::<StreamId>().unwrap(), StreamId { ms: 5, seq: 3 });
        assert_eq!("5".parse::<StreamId>().unwrap(), StreamId { ms: 5, seq: 0 });
        assert_eq!("007-08".parse::<StreamId>().unwrap(), StreamId { ms: 7, seq: 8 });
        for bad in
            ["", "-", "5-", "-5", "5--3", "a-1", "1-2-3", "+", "+5-3", " 5-3", "5-3 ", "$", "18446744073709551616-0"]
        {
            assert!(bad.parse::<StreamId>().is_err(), "{bad}");
        }
        assert_eq!(StreamId::parse_ascii(b"5-18446744073709551616"), None, "past u64");
        assert_eq!(StreamId { ms: 5, seq: 0 }.predecessor(), Some(StreamId { ms: 4, seq: u64::MAX }));
    }

    #[test]
    fn ids_are_written_and_parsed_as_plain_formatting_and_parsing_do() {
        let mut numbers: Vec<u64> = (0..=1_000).collect();
        for shift in 0..64 {
            numbers.extend([1u64 << shift, (1u64 << shift) - 1, (1u64 << shift) + 1]);
        }
        numbers.extend([u64::MAX, u64::MAX - 1, 10u64.pow(19), 10u64.pow(19) - 1, 99, 100, 101, 1_718_000_000_000]);
        for &ms in &numbers {
            for seq in [0, 7, 99, 100, ms] {
                let id = StreamId { ms, seq };
                assert_eq!(id.write_ascii(&mut [0u8; 41]), format!("{ms}-{seq}").as_bytes());
                assert_eq!(id.text_len(), format!("{ms}-{seq}").len());
                assert_eq!(StreamId::parse_ascii(format!("{ms}-{seq}").as_bytes()), Some(id));
                if let Some(branded) = BrandedId::from_stream_id(id) {
                    assert_eq!(BrandedId::parse_ascii(format!("{ms:012x}{seq:016x}").as_bytes()), Some(branded));
                }
            }
        }
        let branded = "019000c79c000000000000000003";
        for k in 0..branded.len() {
            for bad in [b'A', b'g', b'/', b':', b'`', b'G', 0x80 | b'0', 0xff, b' '] {
                let mut text = branded.as_bytes().to_vec();
                text[k] = bad;
                assert_eq!(BrandedId::parse_ascii(&text), None, "{:?}", String::from_utf8_lossy(&text));
            }
        }
    }

    #[test]
    fn milliseconds_past_six_bytes_have_no_branded_id() {
        assert!(BrandedId::from_stream_id(StreamId { ms: MAX_BRANDED_MS + 1, seq: 0 }).is_none());
    }
}
