//! `describe STREAM GROUP`: a group's state (AdminService.DescribeGroup), and
//! each shard's for a sharded stream.

use echomq::proto::{ArchiveInfo, BusyKey, DescribeGroupRequest, DescribeGroupResponse};
use serde_json::{json, Value};

use crate::connect::Context;
use crate::exit::Failure;
use crate::render::instant_text;
use crate::render::{emit, emit_json_document, table};
use crate::time::{duration_ms, format_duration, timestamp_ms};

/// `describe`'s flags.
#[derive(Debug, clap::Args)]
#[command(after_help = "With --json: one document with `stream`, `group`, `pending`, `lag` (null when Redis \
    cannot say), `last_delivered_id` (null for a sharded stream's sum: each shard has its own), `stream_length`, `oldest_pending_id` (null when nothing is pending), \
    `oldest_pending_age_ms`, `max_delivery_count`, `scheduled` (entries scheduled, not yet in the stream), \
    `oldest_scheduled_due_ms` (unix ms the earliest is due; null when none), `consumers` ([{name, pending, idle_ms}]), `archive` (null \
    when the sidecar has no --archive-url; else {entries, files, bytes, oldest_id, archived_through, \
    last_error}, ids and error null when unset; for a sharded stream, per shard), `keyed_entries` (entries held or \
    waiting under per-key limits; 0 without a key field), `busy_keys` ([{key, entries, head_id, head_consumer}], the key \
    as text when it is UTF-8, else `key_hex`) and `shards` \
    (the same fields per shard; empty for a plain stream).")]
pub(crate) struct Args {
    /// The stream key, or the name of a sharded stream (the sidecar's --sharded-streams).
    stream: String,
    /// The consumer group.
    group: String,
}

/// Runs `describe`.
pub(crate) async fn run(args: Args, ctx: &Context) -> Result<(), Failure> {
    let request = DescribeGroupRequest { stream: args.stream.clone(), group: args.group.clone() };
    let state = ctx
        .admin()
        .describe_group(ctx.request(request))
        .await
        .map_err(|s| Failure::status(format!("describe {} {}", args.stream, args.group), s))?
        .into_inner();
    if ctx.json {
        emit_json_document(&to_json(&state))
    } else {
        emit(&to_text(&state))
    }
}

/// The JSON document (durations in milliseconds).
fn to_json(state: &DescribeGroupResponse) -> Value {
    let consumers: Vec<Value> = state
        .consumers
        .iter()
        .map(|c| json!({"name": c.name, "pending": c.pending, "idle_ms": c.idle.as_ref().map(duration_ms)}))
        .collect();
    json!({
        "stream": state.stream,
        "group": state.group,
        "pending": state.pending,
        "lag": state.lag,
        "last_delivered_id": non_empty(&state.last_delivered_id),
        "stream_length": state.stream_length,
        "oldest_pending_id": non_empty(&state.oldest_pending_id),
        "oldest_pending_age_ms": state.oldest_pending_age.as_ref().map(duration_ms),
        "max_delivery_count": state.max_delivery_count,
        "scheduled": state.scheduled,
        "oldest_scheduled_due_ms": state.oldest_scheduled_due.as_ref().map(timestamp_ms),
        "consumers": consumers,
        "archive": state.archive.as_ref().map(archive_json),
        "keyed_entries": state.keyed_entries,
        "busy_keys": state.busy_keys.iter().map(busy_key_json).collect::<Vec<_>>(),
        "shards": state.shards.iter().map(to_json).collect::<Vec<_>>(),
    })
}

/// A busy key as JSON: its key as text, or as hex (`key_hex`) when it is not UTF-8.
fn busy_key_json(key: &BusyKey) -> Value {
    let mut doc = json!({
        "entries": key.entries,
        "head_id": key.head_id,
        "head_consumer": non_empty(&key.head_consumer),
    });
    match std::str::from_utf8(&key.key) {
        Ok(text) => doc["key"] = json!(text),
        Err(_) => doc["key_hex"] = json!(key.key.iter().map(|b| format!("{b:02x}")).collect::<String>()),
    }
    doc
}

/// The most characters of a key the table shows; a longer key is cut there.
const KEY_CELL_CHARS: usize = 64;

/// A key for the table: one bounded line. Printable UTF-8 as it is; a control
/// character, a character that reorders or hides text, `\\` and a byte that is
/// not UTF-8 escaped (`\n`, `\0`, `\\`, `\u{202e}`, `\xff`); in double quotes
/// (`\"` escaped) when it is empty, starts or ends with a space, or starts with
/// a quote; cut after [`KEY_CELL_CHARS`] characters with `… (N bytes)`.
/// `--json` has the exact bytes.
fn key_cell(key: &[u8]) -> String {
    let mut pieces: Vec<String> = Vec::new();
    for chunk in key.utf8_chunks() {
        pieces.extend(chunk.valid().chars().map(key_char));
        pieces.extend(chunk.invalid().iter().map(|b| format!("\\x{b:02x}")));
    }
    let text = String::from_utf8_lossy(key);
    let quoted = text.is_empty()
        || text.starts_with(char::is_whitespace)
        || text.ends_with(char::is_whitespace)
        || text.starts_with('"');
    if quoted {
        for piece in &mut pieces {
            if piece == "\"" {
                *piece = "\\\"".to_owned();
            }
        }
    }
    let mut shown = String::new();
    let mut chars = 0;
    let mut cut = false;
    for piece in &pieces {
        let len = piece.chars().count();
        if chars + len > KEY_CELL_CHARS {
            cut = true;
            break;
        }
        shown.push_str(piece);
        chars += len;
    }
    if quoted {
        shown = format!("\"{shown}\"");
    }
    if cut {
        shown.push_str(&format!("… ({} bytes)", key.len()));
    }
    shown
}

/// One character of a key for the table: itself, or its escape.
fn key_char(c: char) -> String {
    match c {
        '\0' => "\\0".to_owned(),
        '\n' => "\\n".to_owned(),
        '\r' => "\\r".to_owned(),
        '\t' => "\\t".to_owned(),
        '\\' => "\\\\".to_owned(),
        c if c.is_ascii_control() => format!("\\x{:02x}", c as u32),
        // C1 controls, and what reorders or hides text on a terminal: bidi
        // controls, zero-width characters, the byte-order mark.
        '\u{80}'..='\u{9f}'
        | '\u{61c}'
        | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{2069}'
        | '\u{feff}' => format!("\\u{{{:x}}}", c as u32),
        c => c.to_string(),
    }
}

/// What the archive holds of the stream key, as JSON (ids and the error null when unset).
fn archive_json(archive: &ArchiveInfo) -> Value {
    json!({
        "entries": archive.entries,
        "files": archive.files,
        "bytes": archive.bytes,
        "oldest_id": non_empty(&archive.oldest_id),
        "archived_through": non_empty(&archive.archived_through),
        "last_error": non_empty(&archive.last_error),
    })
}

/// The archive's rows of the summary table.
fn archive_rows(archive: &ArchiveInfo) -> Vec<Vec<String>> {
    let dash = |text: &str| if text.is_empty() { "-".to_owned() } else { text.to_owned() };
    vec![
        vec!["archived entries".to_owned(), archive.entries.to_string()],
        vec!["archive files".to_owned(), archive.files.to_string()],
        vec!["archive bytes".to_owned(), archive.bytes.to_string()],
        vec!["oldest archived".to_owned(), dash(&archive.oldest_id)],
        vec!["archived through".to_owned(), dash(&archive.archived_through)],
        vec!["last fold error".to_owned(), dash(&archive.last_error)],
    ]
}

fn non_empty(text: &str) -> Option<&str> {
    (!text.is_empty()).then_some(text)
}

/// The report for people: the group's numbers, its consumers, its shards.
fn to_text(state: &DescribeGroupResponse) -> String {
    let dash = |text: &str| if text.is_empty() { "-".to_owned() } else { text.to_owned() };
    let lag = state.lag.map_or_else(|| "unknown".to_owned(), |lag| lag.to_string());
    let oldest = match (&state.oldest_pending_id[..], &state.oldest_pending_age) {
        ("", _) => "-".to_owned(),
        (id, Some(age)) => format!("{id} (appended {} ago)", format_duration(duration_ms(age))),
        (id, None) => id.to_owned(),
    };
    let mut summary = vec![
        vec!["stream".to_owned(), state.stream.clone()],
        vec!["group".to_owned(), state.group.clone()],
        vec!["pending".to_owned(), state.pending.to_string()],
        vec!["lag".to_owned(), lag],
        vec!["last delivered".to_owned(), dash(&state.last_delivered_id)],
        vec!["stream length".to_owned(), state.stream_length.to_string()],
        vec!["oldest pending".to_owned(), oldest],
        vec!["highest delivery count".to_owned(), state.max_delivery_count.to_string()],
        vec!["scheduled".to_owned(), state.scheduled.to_string()],
        vec!["earliest scheduled due".to_owned(), instant_text(state.oldest_scheduled_due.as_ref())],
    ];
    if state.keyed_entries > 0 {
        summary.push(vec!["keyed entries".to_owned(), state.keyed_entries.to_string()]);
    }
    // A plain stream's archive; a sharded stream's is per shard, below.
    if let Some(archive) = &state.archive {
        summary.extend(archive_rows(archive));
    }
    // A two-column table without a header: the first line of `table` is its header.
    let mut text = table(&["", ""], &summary).lines().skip(1).collect::<Vec<_>>().join("\n");
    text.push_str("\n\n");
    if state.consumers.is_empty() {
        text.push_str("no consumers");
    } else {
        let rows: Vec<Vec<String>> = state
            .consumers
            .iter()
            .map(|c| {
                let idle = c.idle.as_ref().map_or_else(|| "-".to_owned(), |d| format_duration(duration_ms(d)));
                vec![c.name.clone(), c.pending.to_string(), idle]
            })
            .collect();
        text.push_str(&table(&["CONSUMER", "PENDING", "IDLE"], &rows));
    }
    if !state.busy_keys.is_empty() {
        let rows: Vec<Vec<String>> = state
            .busy_keys
            .iter()
            .map(|k| vec![key_cell(&k.key), k.entries.to_string(), k.head_id.clone(), dash(&k.head_consumer)])
            .collect();
        text.push_str("\n\n");
        text.push_str(&table(&["BUSY KEY", "ENTRIES", "HEAD", "HEAD CONSUMER"], &rows));
    }
    if !state.shards.is_empty() {
        let rows: Vec<Vec<String>> = state
            .shards
            .iter()
            .map(|s| {
                let age =
                    s.oldest_pending_age.as_ref().map_or_else(|| "-".to_owned(), |d| format_duration(duration_ms(d)));
                vec![
                    s.stream.clone(),
                    s.pending.to_string(),
                    s.lag.map_or_else(|| "unknown".to_owned(), |lag| lag.to_string()),
                    s.stream_length.to_string(),
                    dash(&s.oldest_pending_id),
                    age,
                    s.max_delivery_count.to_string(),
                    dash(&s.last_delivered_id),
                ]
            })
            .collect();
        text.push_str("\n\n");
        text.push_str(&table(
            &["SHARD", "PENDING", "LAG", "LENGTH", "OLDEST PENDING", "AGE", "MAX DELIVERIES", "LAST DELIVERED"],
            &rows,
        ));
        let archived: Vec<Vec<String>> = state
            .shards
            .iter()
            .filter_map(|s| {
                let a = s.archive.as_ref()?;
                let dash = |text: &str| if text.is_empty() { "-".to_owned() } else { text.to_owned() };
                Some(vec![
                    s.stream.clone(),
                    a.entries.to_string(),
                    a.files.to_string(),
                    a.bytes.to_string(),
                    dash(&a.oldest_id),
                    dash(&a.archived_through),
                    dash(&a.last_error),
                ])
            })
            .collect();
        if !archived.is_empty() {
            text.push_str("\n\n");
            text.push_str(&table(
                &["SHARD", "ARCHIVED", "FILES", "BYTES", "OLDEST ARCHIVED", "ARCHIVED THROUGH", "LAST FOLD ERROR"],
                &archived,
            ));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use echomq::proto::ConsumerInfo;

    use super::*;

    fn state() -> DescribeGroupResponse {
        DescribeGroupResponse {
            stream: "s".into(),
            group: "g".into(),
            pending: 2,
            lag: Some(3),
            last_delivered_id: "5-0".into(),
            consumers: vec![ConsumerInfo {
                name: "pod-a".into(),
                pending: 2,
                idle: Some(prost_types::Duration { seconds: 61, nanos: 0 }),
            }],
            oldest_pending_id: "4-0".into(),
            oldest_pending_age: Some(prost_types::Duration { seconds: 3, nanos: 250_000_000 }),
            max_delivery_count: 1,
            stream_length: 5,
            shards: vec![],
            archive: None,
            scheduled: 2,
            oldest_scheduled_due: Some(prost_types::Timestamp { seconds: 1_796_200_000, nanos: 0 }),
            keyed_entries: 0,
            busy_keys: vec![],
        }
    }

    #[test]
    fn busy_keys_show_in_the_text_and_the_json() {
        let busy = DescribeGroupResponse {
            keyed_entries: 3,
            busy_keys: vec![
                BusyKey { key: b"acct-1".to_vec(), entries: 2, head_id: "4-0".into(), head_consumer: "pod-a".into() },
                BusyKey { key: vec![0xff], entries: 1, head_id: "5-0".into(), head_consumer: String::new() },
            ],
            ..state()
        };
        let text = to_text(&busy);
        assert!(text.contains("keyed entries           3"), "{text}");
        assert!(
            text.contains(
                "BUSY KEY  ENTRIES  HEAD  HEAD CONSUMER\nacct-1    2        4-0   pod-a\n\\xff      1        5-0   -"
            ),
            "{text}"
        );
        let json = to_json(&busy);
        assert_eq!(json["keyed_entries"], 3);
        assert_eq!(json["busy_keys"][0]["key"], "acct-1");
        assert_eq!(json["busy_keys"][1]["key_hex"], "ff");
        assert!(json["busy_keys"][1]["head_consumer"].is_null());
        assert!(!to_text(&state()).contains("BUSY KEY"), "nothing without per-key limits");
    }

    #[test]
    fn keys_print_on_one_line_escaped_and_bounded() {
        for (key, cell) in [
            (&b"acct-1"[..], "acct-1"),
            ("ключ 7 ✓".as_bytes(), "ключ 7 ✓"),
            (b"a b", "a b"),
            (b"", "\"\""),
            (b" ", "\" \""),
            (b" a", "\" a\""),
            (b"a\t", "\"a\\t\""),
            (b"\"a\" b", "\"\\\"a\\\" b\""),
            (b"a\"", "a\""),
            (b"x\ny", "x\\ny"),
            (b"x\0y", "x\\0y"),
            (b"x\ry\x1b[31m", "x\\ry\\x1b[31m"),
            (b"C:\\x", "C:\\\\x"),
            (b"\xff\xfe", "\\xff\\xfe"),
            (b"ok\xffok", "ok\\xffok"),
            ("a\u{202e}b\u{85}c\u{200b}".as_bytes(), "a\\u{202e}b\\u{85}c\\u{200b}"),
            ("a\u{a0}".as_bytes(), "\"a\u{a0}\""),
        ] {
            assert_eq!(key_cell(key), cell, "{key:?}");
        }
        let long = key_cell(&[b'k'; 5_000]);
        assert_eq!(long, format!("{}… (5000 bytes)", "k".repeat(64)));
        assert_eq!(key_cell(&[b'k'; 64]), "k".repeat(64), "64 characters fit");
        let quoted = key_cell(&[&b" "[..], &[b'k'; 100]].concat());
        assert_eq!(quoted, format!("\" {}\"… (101 bytes)", "k".repeat(63)));
        // An escape is never cut in two: 63 characters, then `\n` would make 65.
        let escape = key_cell(&[&[b'k'; 63][..], b"\nk"].concat());
        assert_eq!(escape, format!("{}… (65 bytes)", "k".repeat(63)));
    }

    #[test]
    fn a_long_or_odd_key_keeps_the_table_narrow_and_the_json_exact() {
        let keys: [&[u8]; 4] = [&[b'k'; 5_000], b"", b"x\ny", b"x\0y"];
        let odd = DescribeGroupResponse {
            keyed_entries: 4,
            busy_keys: keys
                .iter()
                .map(|k| BusyKey { key: k.to_vec(), entries: 1, head_id: "4-0".into(), head_consumer: "pod-a".into() })
                .collect(),
            ..state()
        };
        let text = to_text(&odd);
        let table: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("BUSY KEY")).collect();
        assert_eq!(table.len(), 5, "one line per key:\n{text}");
        assert!(table.iter().all(|l| l.chars().count() < 120 && !l.contains('\0')), "{text}");
        assert!(table[1].ends_with("… (5000 bytes)  1        4-0   pod-a"), "{text}");
        assert!(table[2].starts_with("\"\"  "), "{text}");
        assert!(table[3].starts_with("x\\ny  ") && table[4].starts_with("x\\0y  "), "{text}");
        let json = to_json(&odd);
        assert_eq!(json["busy_keys"][0]["key"].as_str().map(str::len), Some(5_000));
        assert_eq!(json["busy_keys"][1]["key"], "");
        assert_eq!(json["busy_keys"][2]["key"], "x\ny");
        assert_eq!(json["busy_keys"][3]["key"], "x\u{0}y");
    }

    #[test]
    fn the_table_names_every_number_and_durations_read_well() {
        let text = to_text(&state());
        for line in [
            "pending                 2",
            "lag                     3",
            "oldest pending          4-0 (appended 3.2s ago)",
            "highest delivery count  1",
            "scheduled               2",
            "earliest scheduled due  2026-12-02T08:26:40.000Z",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        assert!(text.contains("CONSUMER  PENDING  IDLE\npod-a     2        1m 1s"), "{text}");
    }

    fn archive() -> ArchiveInfo {
        ArchiveInfo {
            oldest_id: "1-0".into(),
            archived_through: "3-0".into(),
            entries: 3,
            files: 1,
            bytes: 2_048,
            last_error: String::new(),
        }
    }

    #[test]
    fn without_an_archive_nothing_of_it_prints() {
        let text = to_text(&state());
        assert!(!text.contains("archive"), "{text}");
        assert_eq!(to_json(&state())["archive"], Value::Null);
    }

    #[test]
    fn the_archive_shows_in_the_table_and_in_json() {
        let mut with = state();
        with.archive = Some(ArchiveInfo { last_error: "archive store: disk full".into(), ..archive() });
        let text = to_text(&with);
        for line in [
            "earliest scheduled due  2026-12-02T08:26:40.000Z\narchived entries        3",
            "archive files           1",
            "archive bytes           2048",
            "oldest archived         1-0",
            "archived through        3-0",
            "last fold error         archive store: disk full",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        let json = to_json(&with);
        assert_eq!(
            json["archive"],
            json!({"entries": 3, "files": 1, "bytes": 2048, "oldest_id": "1-0", "archived_through": "3-0",
                   "last_error": "archive store: disk full"})
        );
        with.archive = Some(ArchiveInfo::default());
        let json = to_json(&with);
        assert_eq!(json["archive"]["oldest_id"], Value::Null);
        assert_eq!(json["archive"]["last_error"], Value::Null);
        assert!(to_text(&with).contains("oldest archived         -"));
    }

    #[test]
    fn a_sharded_streams_archive_is_per_shard() {
        let mut shard = state();
        shard.stream = "s:{s:0}".into();
        shard.archive = Some(archive());
        let mut sum = state();
        sum.shards = vec![shard];
        let text = to_text(&sum);
        assert!(
            text.contains(
                "SHARD    ARCHIVED  FILES  BYTES  OLDEST ARCHIVED  ARCHIVED THROUGH  LAST FOLD ERROR\n\
                 s:{s:0}  3         1      2048   1-0              3-0               -"
            ),
            "{text}"
        );
        assert_eq!(to_json(&sum)["shards"][0]["archive"]["entries"], 3);
    }

    #[test]
    fn json_has_milliseconds_and_nulls_for_unknowns() {
        let mut unknown = state();
        unknown.lag = None;
        let json = to_json(&unknown);
        assert_eq!(json["lag"], Value::Null);
        assert_eq!(json["oldest_pending_age_ms"], 3_250);
        assert_eq!(json["consumers"][0]["idle_ms"], 61_000);
    }
}
