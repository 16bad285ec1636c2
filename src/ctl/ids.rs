//! Entry ids as a person types them: a stream id (`<ms>-<seq>` or `<ms>`) or
//! the 28-character branded id every tool prints. Parsed before anything is
//! sent, so a typo is a usage error (exit code 2) that says what an id looks
//! like, not a refusal from the sidecar.
//!
//! A branded id stands for the stream id it was minted as (its 6 bytes of
//! milliseconds and 8 bytes of sequence): that is where the entry sits in the
//! stream it was first appended to. The sidecar's RPCs take stream ids only
//! (`proto/echomq/v1/`), so the command line converts.

use std::fmt;

use echomq::id::{BrandedId, StreamId, BRANDED_ID_LEN};

/// An entry id given on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryId {
    /// A stream id: `<ms>-<seq>`, or `<ms>` for sequence 0.
    Stream(StreamId),
    /// A branded id: 28 lowercase hex characters.
    Branded(BrandedId),
}

impl EntryId {
    /// The stream id to send: the branded id's minted stream id for a branded id.
    pub(crate) fn stream_id(self) -> StreamId {
        match self {
            EntryId::Stream(id) => id,
            EntryId::Branded(id) => id.minted_as(),
        }
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryId::Stream(id) => id.fmt(f),
            EntryId::Branded(id) => id.fmt(f),
        }
    }
}

/// What an entry id looks like, for every refusal.
const EXPECTED: &str = "expected a stream id (`<ms>-<seq>` or `<ms>`, e.g. `1718000000000-3`) or a branded \
    id (28 lowercase hex characters, e.g. `019000c79c000000000000000003`)";

/// Parses a stream id or a branded id, for a flag that takes a bound (`--from`,
/// `--to`, `--min-id`): `0-0` is a fine bound (before every entry).
///
/// Exactly 28 hex characters are a branded id, never a stream id written with
/// leading zeros: every tool prints branded ids, and nobody pads a stream id to
/// 28 digits.
pub(crate) fn parse_bound(text: &str) -> Result<EntryId, String> {
    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b.to_ascii_lowercase());
    if text.len() == BRANDED_ID_LEN && text.bytes().all(hex) {
        if text.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(format!(
                "`{text}` is not a branded id: branded ids are lowercase (`{}`)",
                text.to_ascii_lowercase()
            ));
        }
        return text.parse().map(EntryId::Branded).map_err(|e| e.to_string());
    }
    if let Ok(id) = text.parse() {
        return Ok(EntryId::Stream(id));
    }
    let shown: String = text.chars().take(64).collect();
    if !text.is_empty() && text.bytes().all(hex) && !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "`{shown}` is not an entry id: {} hex characters, but a branded id has {BRANDED_ID_LEN}; {EXPECTED}",
            text.len()
        ));
    }
    Err(format!("`{shown}` is not an entry id: {EXPECTED}"))
}

/// Parses a stream id or a branded id that names one entry (`read --id`, `dlq
/// replay`). `0-0` (or the all-zero branded id) is refused: Redis gives every
/// entry an id above `0-0`, so asking for it is always a mistake (usually an
/// unset variable or a truncated paste), and reading it silently as "not found"
/// hides that.
pub(crate) fn parse_entry(text: &str) -> Result<EntryId, String> {
    let id = parse_bound(text)?;
    if id.stream_id() == StreamId::ZERO {
        let is = if text == "0-0" { String::new() } else { " (it is `0-0`)".to_owned() };
        return Err(format!("`{text}`{is} names no entry: Redis gives every entry an id above `0-0`"));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_branded_id_is_its_minted_stream_id() {
        let id = parse_bound("019000c79c000000000000000003").unwrap();
        assert!(matches!(id, EntryId::Branded(_)));
        assert_eq!(id.stream_id(), StreamId { ms: 1_718_000_000_000, seq: 3 });
        assert_eq!(id.to_string(), "019000c79c000000000000000003");
    }

    #[test]
    fn stream_ids_parse_as_redis_writes_them() {
        assert_eq!(parse_bound("5-3").unwrap(), EntryId::Stream(StreamId { ms: 5, seq: 3 }));
        assert_eq!(parse_bound("5").unwrap(), EntryId::Stream(StreamId { ms: 5, seq: 0 }));
        assert_eq!(parse_bound("0-0").unwrap().stream_id(), StreamId::ZERO);
    }

    #[test]
    fn twenty_eight_digits_are_a_branded_id_not_a_padded_stream_id() {
        let id = parse_bound("0000000000000000000000000003").unwrap();
        assert_eq!(id, EntryId::Branded(BrandedId::from_stream_id(StreamId { ms: 0, seq: 3 }).unwrap()));
    }

    #[test]
    fn the_zero_id_is_a_bound_but_names_no_entry() {
        assert!(parse_bound("0000000000000000000000000000").is_ok());
        for zero in ["0000000000000000000000000000", "0-0", "0"] {
            let e = parse_entry(zero).unwrap_err();
            assert!(e.contains("names no entry"), "{zero}: {e}");
        }
    }

    #[test]
    fn refusals_say_what_an_id_looks_like() {
        for bad in ["", "x-1", "1-x", "-", "019000c79c00000000000000000g", "18446744073709551616-0"] {
            let e = parse_bound(bad).unwrap_err();
            assert!(e.contains("is not an entry id") && e.contains("28 lowercase hex"), "{bad}: {e}");
        }
        let upper = parse_bound("019000C79C000000000000000003").unwrap_err();
        assert!(upper.contains("lowercase (`019000c79c000000000000000003`)"), "{upper}");
        let short = parse_bound("019000c79c00000000000000003").unwrap_err();
        assert!(short.contains("27 hex characters"), "{short}");
    }
}
