//! Turning an entry's fields, as Redis stores them, into the wire's `payload`,
//! `raw_fields` and branded id.

use std::collections::HashSet;

use bytes::Bytes;
use prost_types::Timestamp;

use crate::{
    error::Error,
    id::{BrandedId, StreamId},
    proto::{Entry, RawField},
    redis::RawEntry,
    telemetry::TRACE_FIELD,
};

/// An entry's fields split for the wire, payload values as `V`: `Bytes` for
/// a delivery (slices of the reply they were read in), `Vec<u8>` for Read's
/// entries.
#[derive(Debug, PartialEq)]
pub struct Fields<V> {
    /// The branded id from the reserved field, when it holds a valid one.
    pub branded: Option<BrandedId>,
    /// Fields whose names are valid UTF-8, the first occurrence of each name,
    /// in stream order: a proto `map<string, bytes>` (`payload`) as pairs.
    pub payload: Vec<(Bytes, V)>,
    /// Fields whose names are not valid UTF-8, and repeated names (Redis allows
    /// them; a map cannot hold both), byte for byte, in stream order.
    pub raw_fields: Vec<RawField>,
    /// The W3C trace context from the [`TRACE_FIELD`] field.
    pub traceparent: Option<String>,
}

/// Splits `fields`: the first reserved-name field holding a valid branded id
/// becomes `branded`; the first [`TRACE_FIELD`] becomes `traceparent`; fields
/// for which `skip` is true are dropped (dead-letter metadata); everything
/// else lands in `payload` or `raw_fields`, so no field is ever silently lost.
/// `V` decides where a payload value's bytes live: `Bytes` keeps the slice of
/// the reply it came from (no copy), `Vec<u8>` copies it out.
pub fn split<V: From<Bytes>>(fields: Vec<(Bytes, Bytes)>, id_field: &str, skip: impl Fn(&[u8]) -> bool) -> Fields<V> {
    let mut out =
        Fields { branded: None, payload: Vec::with_capacity(fields.len()), raw_fields: Vec::new(), traceparent: None };
    // Repeated names are found by a scan while the entry has few fields, by
    // a set past that (a scan of thousands of fields per field is quadratic).
    let mut seen: Option<HashSet<Bytes>> = (fields.len() > SCANNED_NAMES).then(HashSet::new);
    for (name, value) in fields {
        if out.branded.is_none() {
            if let Some(id) = reserved_branded(&name, &value, id_field) {
                out.branded = Some(id);
                continue;
            }
        }
        if out.traceparent.is_none() && name == TRACE_FIELD.as_bytes() {
            if let Ok(text) = std::str::from_utf8(&value) {
                out.traceparent = Some(text.to_owned());
                continue;
            }
        }
        if skip(&name) {
            continue;
        }
        // Names are mostly ASCII: checked so before the whole UTF-8 check.
        let first = (name.is_ascii() || std::str::from_utf8(&name).is_ok())
            && match &mut seen {
                Some(seen) => seen.insert(name.clone()),
                None => !out.payload.iter().any(|(earlier, _)| *earlier == name),
            };
        if first {
            out.payload.push((name, V::from(value)));
        } else {
            out.raw_fields.push(RawField { name: name.into(), value: value.into() });
        }
    }
    out
}

/// Entries with at most this many fields find repeated names by a scan.
const SCANNED_NAMES: usize = 16;

/// The branded id a reserved-name field holds: `Some` when `name` is `id_field`
/// and `value` is a valid branded id's text; otherwise the field is payload.
fn reserved_branded(name: &[u8], value: &[u8], id_field: &str) -> Option<BrandedId> {
    if name != id_field.as_bytes() {
        return None;
    }
    BrandedId::parse_ascii(value)
}

/// The branded id of an entry with stream id `id` and these fields, by the
/// rule [`split`] and [`to_entry`] apply: the first reserved-name field holding
/// a valid branded id, else the one derived from the stream id; `None` only
/// when there is no such field and the milliseconds do not fit in 6 bytes.
pub fn branded_id(id: StreamId, fields: &[(Bytes, Bytes)], id_field: &str) -> Option<BrandedId> {
    fields
        .iter()
        .find_map(|(name, value)| reserved_branded(name, value, id_field))
        .or_else(|| BrandedId::from_stream_id(id))
}

/// A protobuf Timestamp as unix milliseconds, for request field `field`.
///
/// Errors: [`Error::InvalidArgument`] for an instant before the unix epoch
/// or for nanos outside 0 to 999,999,999 (not a valid Timestamp).
pub fn unix_ms_of(field: &'static str, at: Timestamp) -> Result<u64, Error> {
    if !(0..1_000_000_000).contains(&at.nanos) {
        return Err(Error::invalid(field, format!("nanos must be 0 to 999,999,999, got {}", at.nanos)));
    }
    if at.seconds < 0 {
        return Err(Error::invalid(field, "must not be before the unix epoch"));
    }
    Ok((at.seconds as u64).saturating_mul(1000).saturating_add(at.nanos as u64 / 1_000_000))
}

/// The current wall-clock time, unix milliseconds (0 before the epoch).
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A unix-millisecond instant as a protobuf Timestamp.
pub fn timestamp(unix_ms: u64) -> Timestamp {
    Timestamp { seconds: (unix_ms / 1000) as i64, nanos: ((unix_ms % 1000) * 1_000_000) as i32 }
}

/// The wire `Entry` of a stream entry; `None` for a deleted entry (no body) or
/// one without a branded id (milliseconds past 6 bytes and no reserved field).
pub fn to_entry(entry: RawEntry, id_field: &str, skip: impl Fn(&[u8]) -> bool) -> Option<Entry> {
    let stream_id: StreamId = entry.id;
    let fields = split::<Vec<u8>>(entry.fields?, id_field, skip);
    let branded = fields.branded.or_else(|| BrandedId::from_stream_id(stream_id))?;
    Some(Entry {
        id: branded.to_string(),
        stream_id: stream_id.to_string(),
        payload: fields
            .payload
            .into_iter()
            .map(|(name, value)| (String::from_utf8_lossy(&name).into_owned(), value))
            .collect(),
        minted_at: Some(timestamp(branded.minted_at_ms())),
        raw_fields: fields.raw_fields,
        traceparent: fields.traceparent.unwrap_or_default(),
        archived: false,
    })
}

/// The metadata fields of a dead letter, as the dead-letter step
/// (`src/consume/dead_letter.lua`) writes them and DeadLetters reads them.
pub mod dead_letter_fields {
    /// The stream the entry was dead-lettered from.
    pub const SOURCE_STREAM: &str = "echomq.source_stream";
    /// Its stream id there.
    pub const SOURCE_ID: &str = "echomq.source_id";
    /// The group that gave up on it.
    pub const GROUP: &str = "echomq.group";
    /// Its delivery count then.
    pub const ATTEMPTS: &str = "echomq.attempts";
    /// Why: the Fail's reason, the last failure's, or the sidecar's.
    pub const REASON: &str = "echomq.reason";
    /// When it was dead-lettered (unix milliseconds, Redis' clock).
    pub const DEAD_LETTERED_AT_MS: &str = "echomq.dead_lettered_at_ms";
    /// Every metadata field name starts so; payload fields never do.
    pub const PREFIX: &str = "echomq.";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_convert_to_unix_ms_and_invalid_ones_are_refused() {
        let at = |seconds, nanos| Timestamp { seconds, nanos };
        assert_eq!(unix_ms_of("f", at(1, 500_000_000)).ok(), Some(1_500));
        assert!(unix_ms_of("f", at(-1, 0)).is_err_and(|e| e.to_string().contains("before the unix epoch")));
        assert!(unix_ms_of("f", at(1, -1)).is_err_and(|e| e.to_string().contains("nanos")));
        assert!(unix_ms_of("f", at(1, 1_000_000_000)).is_err_and(|e| e.to_string().contains("nanos")));
    }
}
