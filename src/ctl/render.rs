//! How things print: values (text or base64, reversibly), entries (a line for
//! people, an object for scripts), tables, and the writes to standard output.
//!
//! Values are bytes. One that is valid UTF-8 prints as text; any other prints
//! as `base64:` and its standard (padded) base64. In a line for people, text
//! is in double quotes with Rust's escapes (`\"`, `\\`, `\n`, `\t`,
//! `\u{1b}`), so a value with spaces or newlines stays on its line and can be
//! read back. In JSON a text value sits under `fields` as a string and any
//! other under `fields_base64` (base64 text), so every key has one type and
//! `append --from-json` takes the object back as it is.

use std::collections::HashMap;
use std::io::Write as _;

use base64::Engine as _;
use echomq::proto::{Entry, RawField};
use serde_json::{json, Map, Value};

use crate::exit::Failure;
use crate::time::{format_instant, timestamp_ms};

/// Standard base64 with padding, as `base64 -d` reads it.
pub(crate) fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes standard base64 (padding optional).
pub(crate) fn from_b64(text: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(text.trim()))
        .map_err(|e| format!("`{text}` is not base64: {e}"))
}

/// A value for people: `"text"` (escaped) or `base64:…`.
pub(crate) fn value_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => format!("{text:?}"),
        Err(_) => format!("base64:{}", b64(bytes)),
    }
}

/// A field name for people: bare when it is a plain word, else quoted.
fn name_text(name: &str) -> String {
    let plain = !name.is_empty()
        && name.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/'))
        && !name.starts_with("base64:");
    if plain {
        name.to_owned()
    } else {
        format!("{name:?}")
    }
}

/// The fields as `name="value" …`, sorted by name; fields whose names are not
/// UTF-8 last, as `<base64:NAME>=VALUE`.
pub(crate) fn fields_text(payload: &HashMap<String, Vec<u8>>, raw: &[RawField]) -> String {
    let mut names: Vec<&String> = payload.keys().collect();
    names.sort();
    let mut parts: Vec<String> =
        names.into_iter().map(|name| format!("{}={}", name_text(name), value_text(&payload[name]))).collect();
    parts.extend(raw.iter().map(|f| format!("<base64:{}>={}", b64(&f.name), value_text(&f.value))));
    parts.join(" ")
}

/// The fields as JSON: `fields` (UTF-8 values as strings) and `fields_base64`
/// (the others), both objects keyed by name; `raw_fields` only when some
/// names are not UTF-8.
pub(crate) fn fields_json(payload: &HashMap<String, Vec<u8>>, raw: &[RawField], into: &mut Map<String, Value>) {
    let mut names: Vec<&String> = payload.keys().collect();
    names.sort();
    let (mut text, mut other) = (Map::new(), Map::new());
    for name in names {
        match std::str::from_utf8(&payload[name]) {
            Ok(value) => text.insert(name.clone(), Value::String(value.to_owned())),
            Err(_) => other.insert(name.clone(), Value::String(b64(&payload[name]))),
        };
    }
    into.insert("fields".into(), Value::Object(text));
    into.insert("fields_base64".into(), Value::Object(other));
    if !raw.is_empty() {
        let raw: Vec<Value> =
            raw.iter().map(|f| json!({"name_base64": b64(&f.name), "value_base64": b64(&f.value)})).collect();
        into.insert("raw_fields".into(), Value::Array(raw));
    }
}

/// An entry as one line for people: `<stream id>  <branded id>  name="value" …`,
/// then `traceparent=…` when set and `[archived]` when it was read from the archive.
pub(crate) fn entry_line(entry: &Entry) -> String {
    let mut line = format!("{}  {}  {}", entry.stream_id, entry.id, fields_text(&entry.payload, &entry.raw_fields));
    if !entry.traceparent.is_empty() {
        line.push_str(&format!("  traceparent={}", entry.traceparent));
    }
    let mut line = line.trim_end().to_owned();
    if entry.archived {
        line.push_str("  [archived]");
    }
    line
}

/// An entry as a JSON object: `stream`, `stream_id`, `id` (branded),
/// `minted_at_ms` (unix ms), `fields`, `fields_base64`, and `raw_fields` and
/// `traceparent` when set, and `archived: true` for an entry read from the archive.
pub(crate) fn entry_json(stream: &str, entry: &Entry) -> Map<String, Value> {
    let mut object = Map::new();
    object.insert("stream".into(), json!(stream));
    object.insert("stream_id".into(), json!(entry.stream_id));
    object.insert("id".into(), json!(entry.id));
    object.insert("minted_at_ms".into(), json!(entry.minted_at.as_ref().map(timestamp_ms)));
    fields_json(&entry.payload, &entry.raw_fields, &mut object);
    if !entry.traceparent.is_empty() {
        object.insert("traceparent".into(), json!(entry.traceparent));
    }
    if entry.archived {
        object.insert("archived".into(), json!(true));
    }
    object
}

/// Prints an entry: a line for people, or one JSON object per line (`--json`).
pub(crate) fn print_entry(json: bool, stream: &str, entry: &Entry) -> Result<(), Failure> {
    if json {
        emit_json_line(&Value::Object(entry_json(stream, entry)))
    } else {
        emit(&entry_line(entry))
    }
}

/// Says on standard error which entries were left out for their size.
pub(crate) fn warn_oversized(stream: &str, ids: &[String]) {
    for id in ids {
        eprintln!(
            "echomqctl: {stream} {id} is too large for one gRPC message (the sidecar's --max-message-bytes): \
             left out; read it with XRANGE"
        );
    }
}

/// An instant for a table (RFC 3339, UTC), `-` when unset.
pub(crate) fn instant_text(t: Option<&prost_types::Timestamp>) -> String {
    t.map(|t| format_instant(timestamp_ms(t))).unwrap_or_else(|| "-".into())
}

/// Columns padded to their widest cell, two spaces apart.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| if i == last { (*c).to_owned() } else { format!("{c:<width$}", width = widths[i]) })
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut out = vec![line(headers.to_vec())];
    out.extend(rows.iter().map(|row| line(row.iter().map(String::as_str).collect())));
    out.join("\n")
}

/// Writes one line (or block) to standard output and flushes it, so a
/// follower (`tail | grep`) sees each entry at once.
pub(crate) fn emit(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

/// One JSON value on one line (NDJSON).
pub(crate) fn emit_json_line(value: &Value) -> Result<(), Failure> {
    emit(&value.to_string())
}

/// One JSON document, indented.
pub(crate) fn emit_json_document(value: &Value) -> Result<(), Failure> {
    emit(&serde_json::to_string_pretty(value).map_err(|e| Failure::Other(format!("JSON output: {e}")))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_values_print_as_quoted_text_and_others_as_base64() {
        assert_eq!(value_text(b"A-1"), "\"A-1\"");
        assert_eq!(value_text(b"a \"b\"\n"), "\"a \\\"b\\\"\\n\"");
        assert_eq!(value_text(&[0xff, 0x00]), "base64:/wA=");
        assert_eq!(from_b64("/wA=").unwrap(), vec![0xff, 0x00]);
        assert_eq!(from_b64("/wA").unwrap(), vec![0xff, 0x00]);
    }

    #[test]
    fn fields_print_sorted_and_json_splits_text_from_bytes() {
        let payload: HashMap<String, Vec<u8>> =
            [("b".to_owned(), b"2".to_vec()), ("a b".to_owned(), vec![0xfe])].into_iter().collect();
        let raw = [RawField { name: vec![0xff], value: b"v".to_vec() }];
        assert_eq!(fields_text(&payload, &raw), r#""a b"=base64:/g== b="2" <base64:/w==>="v""#);
        let mut object = Map::new();
        fields_json(&payload, &raw, &mut object);
        assert_eq!(
            Value::Object(object),
            json!({"fields": {"b": "2"}, "fields_base64": {"a b": "/g=="}, "raw_fields": [{"name_base64": "/w==", "value_base64": "dg=="}]})
        );
    }

    #[test]
    fn archived_entries_say_so_and_live_ones_do_not() {
        let mut entry = Entry {
            id: "0".repeat(28),
            stream_id: "1-0".into(),
            payload: [("a".to_owned(), b"1".to_vec())].into_iter().collect(),
            ..Default::default()
        };
        assert_eq!(entry_line(&entry), format!("1-0  {}  a=\"1\"", "0".repeat(28)));
        assert!(!entry_json("s", &entry).contains_key("archived"));
        entry.archived = true;
        entry.traceparent = "00-t-s-01".into();
        assert_eq!(entry_line(&entry), format!("1-0  {}  a=\"1\"  traceparent=00-t-s-01  [archived]", "0".repeat(28)));
        assert_eq!(entry_json("s", &entry)["archived"], json!(true));
        entry.payload.clear();
        entry.traceparent.clear();
        assert_eq!(entry_line(&entry), format!("1-0  {}  [archived]", "0".repeat(28)));
    }

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![vec!["pod-a".to_owned(), "2".to_owned()], vec!["b".to_owned(), "10".to_owned()]];
        assert_eq!(table(&["CONSUMER", "PENDING"], &rows), "CONSUMER  PENDING\npod-a     2\nb         10");
    }
}
