//! `append STREAM`: one entry from flags, or entries from JSON
//! (StreamService.Append, or AppendBatch for several: all or none).

use std::collections::HashMap;
use std::io::Read as _;

use echomq::proto::{AppendBatchRequest, AppendRequest, AppendResponse, BatchEntry};
use serde_json::{json, Value};

use crate::connect::Context;
use crate::exit::Failure;
use crate::render::{emit, emit_json_line, from_b64, table};
use crate::time::{parse_schedule_instant, timestamp_of_ms};

/// Keys of an entry as `read --json` prints it, besides `fields`, that a
/// re-append ignores: the sidecar mints a new branded id and stream id.
const READ_KEYS: [&str; 7] = ["stream", "stream_id", "id", "minted_at_ms", "group", "attempts", "archived"];

/// The request fields of --at and --in, named by the flag in an INVALID_ARGUMENT.
const SCHEDULE_FLAGS: &[(&str, &str)] =
    &[("deliver_at", "--at"), ("delay", "--in"), ("entries.deliver_at", "--at"), ("entries.delay", "--in")];

/// `append`'s flags.
#[derive(Debug, clap::Args)]
#[command(after_help = "JSON input (--from-json): one or more JSON objects, one entry each (NDJSON or \
    concatenated). Either a plain object of field names to values (`{\"sku\": \"A-1\", \"qty\": 2}`: a string \
    is stored as its UTF-8 bytes, a boolean or an integer as its JSON text, any other number as the \
    shortest decimal that reads back as the same double (`1e2` becomes `100.0`): quote a number to keep its \
    exact text), or an object as `read --json` prints \
    it (`fields`, and `fields_base64` for values that are not UTF-8; its `id`, `stream_id`, … are ignored, \
    since the sidecar mints new ones; a `traceparent` is kept; a `dedup_key` string beside `fields` is the \
    entry's dedup key). Several entries are appended in one AppendBatch call: all of them or none.\n\n\
    With --at or --in every entry is scheduled: it gets its branded id now and enters the stream at that \
    time (`scheduled list` shows it meanwhile, `scheduled cancel` removes it); a time in the past appends \
    at once.\n\n\
    Prints the stream written, the stream id and the branded id of each entry (and DUPLICATE for an entry \
    whose dedup key was already recorded: nothing written, the first append's ids; SCHEDULED for a \
    scheduled entry, whose stream id is only known once it enters the stream); with --json one JSON \
    object per entry (NDJSON): `stream`, `stream_id`, `id`, `duplicate`, `scheduled`.")]
pub(crate) struct Args {
    /// The stream key, or a sharded stream's name (the sidecar picks the shard).
    stream: String,
    /// A field with a UTF-8 value: `NAME=VALUE` (repeatable).
    #[arg(short = 'f', long = "field", value_name = "NAME=VALUE", value_parser = parse_field)]
    fields: Vec<(String, Vec<u8>)>,
    /// A field with any bytes as its value, in standard base64: `NAME=BASE64` (repeatable); what
    /// `read` prints as `base64:…`.
    #[arg(long = "field-base64", value_name = "NAME=BASE64", value_parser = parse_field_base64)]
    fields_base64: Vec<(String, Vec<u8>)>,
    /// Entries as JSON: the JSON text itself, `@FILE`, or `-` for standard input.
    #[arg(long, value_name = "JSON|@FILE|-", conflicts_with_all = ["fields", "fields_base64"])]
    from_json: Option<String>,
    /// Trim the stream to about this many entries as part of the XADD (`MAXLEN ~`). Unlike
    /// `trim`, this does NOT spare entries a group has pending or not read yet.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_len: Option<u64>,
    /// For a sharded stream: entries with the same key go to the same shard.
    #[arg(long)]
    partition_key: Option<String>,
    /// Make the append idempotent: appending again with the same key within the sidecar's
    /// --dedup-window-ms writes nothing and prints the first append's ids (DUPLICATE). Retry an
    /// append whose outcome is unknown with the same key. One entry only; in JSON input give each
    /// entry a `dedup_key` beside its `fields`.
    #[arg(long, value_name = "KEY", value_parser = parse_dedup_key)]
    dedup_key: Option<String>,
    /// Schedule the entries: they enter the stream at this instant (RFC 3339, e.g.
    /// `2026-12-07T09:00:00+01:00`, or unix milliseconds), at most 365 days ahead; a duration is
    /// refused (use --in).
    #[arg(long, value_name = "INSTANT", value_parser = parse_schedule_instant, conflicts_with = "in_")]
    at: Option<u64>,
    /// Schedule the entries this long from now (`90s`, `10m`, `2h`, `1d`), at most 365 days.
    #[arg(id = "in_", long = "in", value_name = "DURATION", value_parser = parse_delay)]
    in_: Option<std::time::Duration>,
}

fn parse_delay(text: &str) -> Result<std::time::Duration, String> {
    echomq::config::parse_duration(text.trim())
        .ok_or_else(|| format!("`{text}` is not a duration: expected a whole number and a unit, e.g. 90s, 10m, 2h, 1d"))
}

fn parse_dedup_key(text: &str) -> Result<String, String> {
    match text {
        "" => Err("an empty dedup key would not deduplicate; leave --dedup-key out instead".into()),
        key => Ok(key.to_owned()),
    }
}

/// One entry to append: its fields and its dedup key (empty: none).
type NewEntry = (HashMap<String, Vec<u8>>, String);

fn parse_field(text: &str) -> Result<(String, Vec<u8>), String> {
    let (name, value) = text.split_once('=').ok_or_else(|| format!("`{text}` is not NAME=VALUE"))?;
    Ok((name.to_owned(), value.as_bytes().to_vec()))
}

fn parse_field_base64(text: &str) -> Result<(String, Vec<u8>), String> {
    let (name, value) = text.split_once('=').ok_or_else(|| format!("`{text}` is not NAME=BASE64"))?;
    Ok((name.to_owned(), from_b64(value)?))
}

/// The entries given as JSON.
fn entries_from_json(text: &str) -> Result<Vec<NewEntry>, String> {
    let mut entries = Vec::new();
    for (n, value) in serde_json::Deserializer::from_str(text).into_iter::<Value>().enumerate() {
        let value = value.map_err(|e| format!("JSON input: {e}"))?;
        entries.push(entry_from_json(&value).map_err(|e| format!("JSON input, entry {}: {e}", n + 1))?);
    }
    if entries.is_empty() {
        return Err("JSON input: no entry (expected one JSON object per entry)".into());
    }
    Ok(entries)
}

/// One entry: a plain object of values, or the shape `read --json` prints.
fn entry_from_json(value: &Value) -> Result<NewEntry, String> {
    let Value::Object(object) = value else {
        return Err(format!("expected an object of fields, got {value}"));
    };
    let mut fields = HashMap::new();
    let mut dedup_key = String::new();
    if let Some(Value::Object(text)) = object.get("fields") {
        for (key, value) in object {
            match (key.as_str(), value) {
                ("fields", _) => {}
                ("fields_base64", Value::Object(encoded)) => {
                    for (name, value) in encoded {
                        let Value::String(value) = value else {
                            return Err(format!("fields_base64.{name}: expected a base64 string"));
                        };
                        fields.insert(name.clone(), from_b64(value).map_err(|e| format!("fields_base64.{name}: {e}"))?);
                    }
                }
                ("dedup_key", Value::String(key)) => dedup_key.clone_from(key),
                ("dedup_key", _) => return Err("dedup_key: expected a string".into()),
                ("traceparent", Value::String(trace)) => {
                    fields.insert("traceparent".to_owned(), trace.as_bytes().to_vec());
                }
                ("raw_fields", _) => {
                    return Err("raw_fields: field names that are not UTF-8 cannot be appended through gRPC".into())
                }
                (key, _) if READ_KEYS.contains(&key) => {}
                (key, _) => return Err(format!("unexpected key `{key}` beside `fields`")),
            }
        }
        for (name, value) in text {
            fields.insert(name.clone(), scalar(name, value)?);
        }
    } else {
        for (name, value) in object {
            fields.insert(name.clone(), scalar(name, value)?);
        }
    }
    Ok((fields, dedup_key))
}

/// A JSON value as field bytes: a string's UTF-8, a number's or boolean's JSON text.
fn scalar(name: &str, value: &Value) -> Result<Vec<u8>, String> {
    match value {
        Value::String(text) => Ok(text.as_bytes().to_vec()),
        Value::Number(_) | Value::Bool(_) => Ok(value.to_string().into_bytes()),
        _ => Err(format!("field `{name}`: expected a string, number or boolean, got {value}")),
    }
}

/// The fields of `-f` and `--field-base64`: a name given twice is refused, not
/// silently overwritten, and so is an empty name.
fn fields_from_flags(
    text: &[(String, Vec<u8>)],
    base64: &[(String, Vec<u8>)],
) -> Result<HashMap<String, Vec<u8>>, String> {
    let mut fields = HashMap::new();
    for (name, value) in text.iter().chain(base64) {
        if name.is_empty() {
            return Err("a field needs a name: `NAME=VALUE`, got `=…`".into());
        }
        if fields.insert(name.clone(), value.clone()).is_some() {
            return Err(format!("field `{name}` is given twice; an entry has one value per name"));
        }
    }
    Ok(fields)
}

/// The JSON text of `--from-json`: itself, a file, or standard input.
fn json_text(source: &str) -> Result<String, Failure> {
    if source == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| Failure::Usage(format!("--from-json -: cannot read standard input: {e}")))?;
        return Ok(text);
    }
    match source.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| Failure::Usage(format!("--from-json @{path}: {e}"))),
        None => Ok(source.to_owned()),
    }
}

/// Runs `append`.
pub(crate) async fn run(args: Args, ctx: &Context) -> Result<(), Failure> {
    let mut entries = match &args.from_json {
        Some(source) => entries_from_json(&json_text(source)?).map_err(Failure::Usage)?,
        None => vec![(fields_from_flags(&args.fields, &args.fields_base64).map_err(Failure::Usage)?, String::new())],
    };
    if let Some(key) = &args.dedup_key {
        match entries.as_mut_slice() {
            [(_, dedup_key)] => dedup_key.clone_from(key),
            _ => {
                return Err(Failure::Usage(
                    "--dedup-key names one entry's key; for several entries, give each a `dedup_key` beside its \
                     `fields` in the JSON input"
                        .into(),
                ))
            }
        }
    }
    let doing = format!("append to {}", args.stream);
    let deliver_at = args.at.map(timestamp_of_ms);
    let delay = args.in_.map(|d| prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 });
    let written: Vec<AppendResponse> = if entries.len() == 1 {
        let (fields, dedup_key) = entries.into_iter().next().unwrap_or_default();
        let request = AppendRequest {
            stream: args.stream.clone(),
            fields,
            max_len: args.max_len.unwrap_or(0),
            partition_key: args.partition_key.clone().unwrap_or_default(),
            dedup_key,
            deliver_at,
            delay,
        };
        vec![ctx
            .stream()
            .append(ctx.request(request))
            .await
            .map_err(|s| Failure::status_of_flags(&doing, s, SCHEDULE_FLAGS))?
            .into_inner()]
    } else {
        let request = AppendBatchRequest {
            stream: args.stream.clone(),
            entries: entries
                .into_iter()
                .map(|(fields, dedup_key)| BatchEntry { fields, dedup_key, deliver_at, delay })
                .collect(),
            max_len: args.max_len.unwrap_or(0),
            partition_key: args.partition_key.clone().unwrap_or_default(),
        };
        ctx.stream()
            .append_batch(ctx.request(request))
            .await
            .map_err(|s| Failure::status_of_flags(&doing, s, SCHEDULE_FLAGS))?
            .into_inner()
            .entries
    };
    if ctx.json {
        for w in &written {
            emit_json_line(
                &json!({"stream": w.stream, "stream_id": w.stream_id, "id": w.id, "duplicate": w.duplicate, "scheduled": w.scheduled}),
            )?;
        }
        Ok(())
    } else if written.iter().any(|w| w.duplicate || w.scheduled) {
        let yes = |flag: bool| if flag { "yes" } else { "no" }.to_owned();
        let rows: Vec<Vec<String>> = written
            .iter()
            .map(|w| {
                let stream_id = if w.stream_id.is_empty() { "-".to_owned() } else { w.stream_id.clone() };
                vec![w.stream.clone(), stream_id, w.id.clone(), yes(w.duplicate), yes(w.scheduled)]
            })
            .collect();
        emit(&table(&["STREAM", "STREAM ID", "ID", "DUPLICATE", "SCHEDULED"], &rows))
    } else {
        let rows: Vec<Vec<String>> =
            written.iter().map(|w| vec![w.stream.clone(), w.stream_id.clone(), w.id.clone()]).collect();
        emit(&table(&["STREAM", "STREAM ID", "ID"], &rows))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_objects_and_read_output_both_append() {
        let entries = entries_from_json(
            r#"{"sku": "A-1", "qty": 2, "ok": true}
               {"stream": "s", "id": "x", "stream_id": "1-0", "minted_at_ms": 1, "fields": {"a": "b"}, "fields_base64": {"bin": "/wA="}}"#,
        )
        .unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].0["sku"], b"A-1");
        assert_eq!(entries[0].0["qty"], b"2");
        assert_eq!(entries[0].0["ok"], b"true");
        assert_eq!(entries[1].0.len(), 2);
        assert_eq!(entries[1].0["bin"], vec![0xff, 0x00]);
        assert!(entries.iter().all(|(_, dedup_key)| dedup_key.is_empty()));
        let keyed = entries_from_json(r#"{"fields": {"a": "b"}, "dedup_key": "order-7"}"#).unwrap();
        assert_eq!(keyed[0].1, "order-7");
        assert_eq!(
            entries_from_json(r#"{"dedup_key": "x"}"#).unwrap()[0].0["dedup_key"],
            b"x",
            "a plain object's keys are fields"
        );
    }

    #[test]
    fn bad_json_is_refused_with_a_reason() {
        for (text, says) in [
            ("", "no entry"),
            ("[1]", "expected an object"),
            (r#"{"a": null}"#, "field `a`"),
            (r#"{"fields": {}, "extra": 1}"#, "unexpected key `extra`"),
            (r#"{"fields": {}, "dedup_key": 7}"#, "dedup_key"),
            (r#"{"fields": {}, "fields_base64": {"a": "!!"}}"#, "not base64"),
            ("{", "JSON input"),
        ] {
            let error = entries_from_json(text).unwrap_err();
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }

    #[test]
    fn fields_split_at_the_first_equals_sign() {
        assert_eq!(parse_field("k=a=b").unwrap(), ("k".to_owned(), b"a=b".to_vec()));
        assert!(parse_field("k").is_err());
        assert_eq!(parse_field_base64("k=/wA=").unwrap().1, vec![0xff, 0x00]);
    }
}
