//! Reply parsing: stream entries as XRANGE, XCLAIM and XREADGROUP return
//! them, script replies' shapes, and the plain values inside them.

use bytes::Bytes;
use redis::{RedisResult, Value};

use crate::id::StreamId;

/// One stream entry as Redis returned it, field names and values as bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawEntry {
    /// The entry's stream id.
    pub id: StreamId,
    /// Field name/value pairs in stream order; `None` when Redis returned the id
    /// with no body: the entry was deleted (trimmed) while pending. `Bytes`:
    /// read by a group reader, they are slices of the reply they came in
    /// (see [`super::resp`]), and a delivery's payload keeps its values
    /// without a copy each.
    pub fields: Option<Vec<(Bytes, Bytes)>>,
}

/// Parses a list of entries (`[[id, [field, value, …]], …]`, as XRANGE, XCLAIM
/// and each stream of XREADGROUP return them). Malformed items are an error, not
/// skipped, so an entry is never silently dropped. Takes the reply by value:
/// field names and values move into the entries, uncopied (on the delivery
/// path they are most of the bytes).
pub fn parse_entries(value: Value) -> RedisResult<Vec<RawEntry>> {
    match value {
        Value::Nil => Ok(Vec::new()),
        Value::Array(items) => items.into_iter().map(parse_entry).collect(),
        other => Err(unexpected("a list of stream entries", &other)),
    }
}

/// Parses one `[id, [field, value, …]]` (or `[id, nil]`).
pub fn parse_entry(value: Value) -> RedisResult<RawEntry> {
    let Value::Array(parts) = value else {
        return Err(unexpected("a stream entry", &value));
    };
    if parts.is_empty() {
        return Err(unexpected("a stream entry", &Value::Array(parts)));
    }
    let mut parts = parts.into_iter();
    let id = parse_stream_id(&parts.next().unwrap_or(Value::Nil))?;
    let fields = match parts.next() {
        None | Some(Value::Nil) => None,
        Some(Value::Array(flat)) if flat.len() % 2 == 0 => {
            let mut fields = Vec::with_capacity(flat.len() / 2);
            let mut flat = flat.into_iter();
            while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
                fields.push((Bytes::from(into_bytes(name)?), Bytes::from(into_bytes(value)?)));
            }
            Some(fields)
        }
        Some(other) => return Err(unexpected("an entry's field list", &other)),
    };
    Ok(RawEntry { id, fields })
}

/// Parses an XREADGROUP reply for a single stream: nil on timeout, else
/// `[[stream, entries]]` (a map under RESP3). By value, as [`parse_entries`].
pub fn parse_read_reply(value: Value) -> RedisResult<Vec<RawEntry>> {
    match value {
        Value::Nil => Ok(Vec::new()),
        Value::Array(streams) => {
            let mut entries = Vec::new();
            for stream in streams {
                match stream {
                    Value::Array(pair) if pair.len() == 2 => {
                        let list = pair.into_iter().nth(1).unwrap_or(Value::Nil);
                        if entries.is_empty() {
                            entries = parse_entries(list)?;
                        } else {
                            entries.extend(parse_entries(list)?);
                        }
                    }
                    other => return Err(unexpected("[stream, entries]", &other)),
                }
            }
            Ok(entries)
        }
        Value::Map(streams) => {
            let mut entries = Vec::new();
            for (_, list) in streams {
                entries.extend(parse_entries(list)?);
            }
            Ok(entries)
        }
        other => Err(unexpected("an XREADGROUP reply", &other)),
    }
}

/// The items of an array reply; empty for anything else (nil included).
pub fn array(value: &Value) -> &[Value] {
    match value {
        Value::Array(items) => items,
        _ => &[],
    }
}

/// One item of a script's reply shaped `{ stream id, tag, … }` (the consume
/// scripts' replies): the id, the tag, and what follows it. A malformed item
/// is an error, never skipped.
pub fn tagged(item: &Value) -> RedisResult<(StreamId, String, &[Value])> {
    let parts = array(item);
    let (Some(id), Some(tag)) = (parts.first(), parts.get(1)) else {
        return Err(unexpected("{ stream id, tag, … }", item));
    };
    let tag = String::from_utf8(bytes(tag)?).map_err(|_| unexpected("a reply tag", item))?;
    Ok((parse_stream_id(id)?, tag, &parts[2..]))
}

/// The Parse error for a [`tagged`] reply whose tag `script`'s wrapper does
/// not know: the script and its wrapper disagree.
pub fn unknown_tag(script: &str, tag: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected reply from Redis",
        format!("{script} replied `{tag}`"),
    ))
}

/// An integer reply, or a script's integer.
pub fn int(value: &Value) -> RedisResult<i64> {
    match value {
        Value::Int(n) => Ok(*n),
        other => Err(unexpected("an integer", other)),
    }
}

/// Parses a stream id given as a bulk or simple string.
pub fn parse_stream_id(value: &Value) -> RedisResult<StreamId> {
    let text = String::from_utf8(bytes(value)?).map_err(|_| unexpected("a stream id", value))?;
    text.parse().map_err(|_| unexpected("a stream id", value))
}

/// Entries a trim removed before a consumer group had been delivered them,
/// as `trim_counting_unread` (`lua/prelude.lua`) reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreadTrimmed {
    /// The consumer group that lost them.
    pub group: String,
    /// How many (entries); `None`: more than the script could count (it reads
    /// at most 100,000 ids ahead), never a guess.
    pub entries: Option<u64>,
}

/// Parses the flat `{ group, count, … }` list of `trim_counting_unread`.
pub fn parse_unread_trimmed(value: &Value) -> RedisResult<Vec<UnreadTrimmed>> {
    let Value::Array(items) = value else {
        return Err(unexpected("a list of groups and counts", value));
    };
    items
        .chunks(2)
        .map(|pair| match pair {
            [group, Value::Int(count)] => Ok(UnreadTrimmed {
                group: String::from_utf8_lossy(&bytes(group)?).into_owned(),
                entries: u64::try_from(*count).ok(),
            }),
            _ => Err(unexpected("a group and a count", value)),
        })
        .collect()
}

/// The bytes of a bulk or simple string, moved out of the reply.
fn into_bytes(value: Value) -> RedisResult<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        Value::SimpleString(text) => Ok(text.into_bytes()),
        other => bytes(&other),
    }
}

/// The bytes of a bulk or simple string.
pub fn bytes(value: &Value) -> RedisResult<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Ok(bytes.clone()),
        Value::SimpleString(text) => Ok(text.clone().into_bytes()),
        Value::Okay => Ok(b"OK".to_vec()),
        Value::Int(n) => Ok(n.to_string().into_bytes()),
        other => Err(unexpected("a string", other)),
    }
}

fn unexpected(what: &str, got: &Value) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected reply from Redis",
        format!("expected {what}, got {got:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &[u8]) -> Value {
        Value::BulkString(text.to_vec())
    }

    #[test]
    fn parses_entries_with_binary_fields_and_deleted_bodies() {
        let reply = Value::Array(vec![
            Value::Array(vec![bulk(b"1-1"), Value::Array(vec![bulk(b"\xff\x00"), bulk(b"v")])]),
            Value::Array(vec![bulk(b"2-0"), Value::Nil]),
        ]);
        let entries = parse_entries(reply).unwrap();
        assert_eq!(entries[0].id, StreamId { ms: 1, seq: 1 });
        assert_eq!(entries[0].fields, Some(vec![(Bytes::from_static(b"\xff\x00"), Bytes::from_static(b"v"))]));
        assert_eq!(entries[1].fields, None);
    }

    #[test]
    fn odd_field_lists_are_an_error_not_a_drop() {
        let reply = Value::Array(vec![Value::Array(vec![bulk(b"1-1"), Value::Array(vec![bulk(b"k")])])]);
        assert!(parse_entries(reply).is_err());
    }

    #[test]
    fn read_reply_timeout_is_empty() {
        assert!(parse_read_reply(Value::Nil).unwrap().is_empty());
    }
}
