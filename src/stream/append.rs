//! Append and AppendBatch: validate → run `append.lua` (check dedup keys,
//! mint branded ids, XADD and record the keys, atomically; through the
//! durable writer when writes wait for replicas) → map the stream ids to the
//! response.

use std::collections::HashMap;

use super::{
    scheduled::{self, Due},
    Streams,
};
use crate::{
    durable::{run, ScriptCall, ScriptName, Shortfall},
    error::Error,
    id::{BrandedId, StreamId},
    proto::{AppendBatchRequest, AppendBatchResponse, AppendRequest, AppendResponse},
    redis::{bytes, parse_stream_id, parse_unread_trimmed},
    security::Caller,
    telemetry::{self, TRACE_FIELD},
};
use tracing::Instrument;

/// Most entries in one AppendBatch.
pub const MAX_BATCH_ENTRIES: usize = 10_000;

/// One entry to append: its fields, its dedup key ("": none), and the
/// request fields they came from (for INVALID_ARGUMENT).
struct NewEntry<'a> {
    /// Its index in an AppendBatch (None for an Append), named in errors.
    batch_index: Option<usize>,
    fields_field: &'static str,
    fields: &'a HashMap<String, Vec<u8>>,
    dedup_field: &'static str,
    dedup_key: &'a str,
    /// When it enters the stream (`deliver_at`/`delay`).
    due: Due,
}

/// Appends `entries` to `stream` in one script run and returns their
/// (branded id, stream id, stream key, duplicate) in order. A sharded
/// stream's shard is picked by `partition_key`, else by the first dedup key
/// of the entries (so a retry finds the record on the shard that wrote it),
/// else in turn (see [`crate::keys::Keyspace::append_target`]). An entry
/// whose dedup key is recorded (`<stream>:dedup:<key>`, within
/// `--dedup-window-ms`), or repeats an earlier entry's key, is not written
/// and answers the recorded ids with `duplicate`. `max_len` 0: no trimming.
///
/// Errors: [`Error::InvalidArgument`] for a bad stream name (on a cluster, also
/// one no group could consume: see [`crate::keys::Keyspace::consumable`]; a
/// shard key this sidecar does not shard), too many fields, a dedup key over
/// `--max-name-bytes`, or a field named like the reserved id field;
/// [`Error::Conflict`] for a `max_len` when this sidecar archives or the
/// stream is archived (its `<stream>:archive:through` key exists);
/// [`Error::WrongType`] when the key is not a stream (or a dedup record is
/// not a string); [`Error::Unavailable`] when Redis is down;
/// [`Error::Unconfirmed`] (UNAVAILABLE) when `--wait-replicas`/`--wait-aof`
/// did not confirm the write in time, naming the ids written.
async fn append_entries(
    streams: &Streams,
    caller: Option<&Caller>,
    traceparent: Option<&str>,
    stream: &str,
    partition_key: &str,
    entries: &[NewEntry<'_>],
    max_len: u64,
) -> Result<Vec<AppendResponse>, Error> {
    let logical = streams.guard.stream(caller, "stream", stream)?;
    let scheduling = entries.iter().any(|entry| entry.due != Due::Now);
    if max_len > 0 && scheduling {
        return Err(Error::invalid(
            "max_len",
            "a scheduled entry (deliver_at or delay) enters the stream later, where no request could answer for what the cap removes; drop max_len, and cap the stream with Trim or --retention",
        ));
    }
    if max_len > 0 && streams.archive.is_some() {
        return Err(Error::Conflict {
            reason: "max_len: this sidecar archives what trims remove (--archive-url), and an Append's max_len \
                     trims inside XADD, before anything could be archived; drop max_len and cap the stream with \
                     --retention NAME=maxlen:N"
                .to_owned(),
        });
    }
    for entry in entries {
        if entry.dedup_key.len() > streams.guard.max_name_bytes {
            return Err(Error::invalid(
                entry.dedup_field,
                format!(
                    "{} bytes is longer than this sidecar's limit of {} (--max-name-bytes); use a shorter key, such \
                     as a hash of it",
                    entry.dedup_key.len(),
                    streams.guard.max_name_bytes
                ),
            )
            .in_batch_entry(entry.batch_index));
        }
    }
    let keys = &streams.redis.keys;
    streams.redis.refuse_foreign_shard_key("stream", logical).await?;
    // A retry carries the same dedup key: hashing it (when no partition key
    // is given) sends the retry to the shard that holds its record.
    let pick = match partition_key {
        "" => entries.iter().map(|entry| entry.dedup_key).find(|key| !key.is_empty()).unwrap_or(""),
        key => key,
    };
    let target = keys.append_target(logical, pick.as_bytes());
    let stream = target.key.as_str();
    keys.consumable("stream", stream)?;
    // Only while traces are exported: nothing logs inside it.
    let span = if telemetry::exporting() {
        // The conventions' batch count is for batches only, the message id
        // for single messages (recorded once the script has minted it).
        let batch = (entries.len() > 1).then_some(entries.len() as i64);
        tracing::info_span!(
            "echomq.append",
            otel.kind = "producer",
            messaging.system = telemetry::MESSAGING_SYSTEM,
            messaging.operation.type = "send",
            messaging.operation.name = "append",
            messaging.destination.name = stream,
            messaging.batch.message_count = batch,
            messaging.message.id = tracing::field::Empty,
        )
    } else {
        tracing::Span::none()
    };
    telemetry::set_parent(&span, traceparent);
    // The context consumers continue: this append's span when traces are
    // exported, else the caller's own, so it still crosses the stream.
    let stored = telemetry::traceparent_of(&span).or_else(|| traceparent.map(str::to_owned));
    let max_fields = streams.guard.max_fields_per_entry;
    let id_field = &streams.id_field;
    let count_key = keys.shard_count_key_to_check(stream).unwrap_or_else(|| stream.to_owned());
    let through_key = if max_len > 0 { keys.archive_through(stream) } else { stream.to_owned() };
    // KEYS[4…]: each distinct dedup record once; an entry names its record by index.
    let mut script_keys =
        vec![stream.to_owned(), count_key, through_key.clone(), keys.scheduled(stream), keys.scheduled_entries(stream)];
    let mut records: HashMap<&str, usize> = HashMap::new();
    let record_of: Vec<usize> = entries
        .iter()
        .map(|entry| match entry.dedup_key {
            "" => 0,
            key => *records.entry(key).or_insert_with(|| {
                script_keys.push(keys.dedup(stream, key));
                script_keys.len()
            }),
        })
        .collect();
    let durable = streams.writes.durable.as_ref();
    let mut script = ScriptCall::new(&streams.redis, ScriptName::Append, &script_keys);
    script
        .arg(id_field)
        .arg(max_len)
        .arg(target.shard)
        .arg(target.shards)
        .arg(u64::try_from(streams.writes.dedup_window.as_millis()).unwrap_or(u64::MAX))
        .arg(u8::from(durable.is_some()))
        .arg(entries.len());
    for (entry, record) in entries.iter().zip(&record_of) {
        let (field, fields) = (entry.fields_field, entry.fields);
        if fields.contains_key(id_field) {
            return Err(Error::invalid(
                field,
                format!("`{id_field}` is the reserved field that carries the branded id; rename the field"),
            )
            .in_batch_entry(entry.batch_index));
        }
        if fields.len() > max_fields {
            return Err(Error::invalid(
                field,
                format!("{} fields is more than this sidecar's limit of {max_fields}", fields.len()),
            )
            .in_batch_entry(entry.batch_index));
        }
        // Sorted, so an entry's field order does not depend on hashing.
        let mut sorted: Vec<_> = fields.iter().collect();
        sorted.sort_unstable_by_key(|(name, _)| name.as_str());
        let trace = stored.as_deref().filter(|_| !fields.contains_key(TRACE_FIELD));
        let (at, after) = entry.due.args();
        script.arg(*record).arg(at).arg(after).arg(sorted.len() + usize::from(trace.is_some()));
        for (name, value) in sorted {
            script.arg(name.as_str()).arg(value.as_slice());
        }
        if let Some(trace) = trace {
            script.arg(TRACE_FIELD).arg(trace);
        }
    }
    // Indexed before the script writes the schedule, so a sidecar that dies
    // right after the script leaves the stream where movers look (see
    // `scheduled`); again after it, with the exact time.
    let now_ms = crate::entry::now_unix_ms();
    if let Some(earliest) = entries.iter().filter_map(|entry| entry.due.estimate(now_ms)).min() {
        scheduled::index(&streams.redis, stream, earliest).await?;
    }
    let mut conn = streams.redis.conn.clone();
    let ran = run(&streams.redis, &mut conn, durable, script);
    let (reply, shortfall) = ran.instrument(span.clone()).await.map_err(|e| match e.code() {
        Some("ECHOMQ_SHARDED") => keys.unconfigured_sharded(stream, e.detail().unwrap_or("?")),
        Some("ECHOMQ_ARCHIVED") => Error::Conflict {
            reason: format!(
                "max_len: stream `{stream}` is archived (`{through_key}` exists), and an Append's max_len trims \
                 inside the append, before anything could be archived; drop max_len and cap the stream with \
                 --retention NAME=maxlen:N on the sidecars that archive it"
            ),
        },
        _ if scheduling => scheduled::from_redis_scheduled(e, "appending (append.lua)", &streams.redis, stream),
        _ => Error::from_redis(e, "appending (append.lua)", stream),
    })?;
    let redis::Value::Array(reply) = reply else {
        let unexpected = redis::RedisError::from((redis::ErrorKind::Parse, "append.lua did not return a list"));
        return Err(Error::from_redis(unexpected, "appending (append.lua)", stream));
    };
    let [redis::Value::Array(ids), unread, redis::Value::Array(duplicates), redis::Value::Array(planned)] =
        reply.as_slice()
    else {
        let unexpected = redis::RedisError::from((
            redis::ErrorKind::Parse,
            "append.lua did not return ids, groups, duplicates and scheduled entries",
        ));
        return Err(Error::from_redis(unexpected, "appending (append.lua)", stream));
    };
    // Entry number (1-based) → the branded id minted for it, for the scheduled ones.
    let mut minted: HashMap<i64, String> = HashMap::new();
    let mut earliest: Option<u64> = None;
    for triple in planned.chunks(3) {
        if let [redis::Value::Int(entry), branded, redis::Value::Int(due)] = triple {
            let branded = bytes(branded).map_err(|e| Error::from_redis(e, "reading append.lua's reply", stream))?;
            minted.insert(*entry, String::from_utf8_lossy(&branded).into_owned());
            earliest = Some(earliest.map_or(*due as u64, |e| e.min(*due as u64)));
        }
    }
    if let Some(earliest) = earliest {
        reindex_after_append(streams, stream, earliest).await;
        streams.mover_wake.at(earliest);
    }
    // Entry number (1-based) → the recorded branded id, for the duplicates.
    let mut recorded: HashMap<i64, String> = HashMap::new();
    for pair in duplicates.chunks(2) {
        if let [redis::Value::Int(entry), branded] = pair {
            let branded = bytes(branded).map_err(|e| Error::from_redis(e, "reading append.lua's reply", stream))?;
            recorded.insert(*entry, String::from_utf8_lossy(&branded).into_owned());
        }
    }
    // Written, whatever the reply's parsing says next: counted now.
    streams.metrics.streams.appended(stream, keys.sharded_stream_of(stream), ids.len() - recorded.len() - minted.len());
    let unread =
        parse_unread_trimmed(unread).map_err(|e| Error::from_redis(e, "reading append.lua's reply", stream))?;
    streams.report_unread_trimmed(stream, &unread, "append_max_len");
    let written = ids
        .iter()
        .zip(1..)
        .map(|(id, entry)| {
            // '': scheduled, by this append or by the one a duplicate repeats.
            let stream_id: Option<StreamId> = match id {
                redis::Value::BulkString(text) if text.is_empty() => None,
                id => {
                    Some(parse_stream_id(id).map_err(|e| Error::from_redis(e, "reading append.lua's reply", stream))?)
                }
            };
            let (id, duplicate) = match (recorded.remove(&entry), minted.remove(&entry), stream_id) {
                (Some(branded), _, _) => (branded, true),
                (None, Some(branded), _) => (branded, false),
                (None, None, Some(stream_id)) => {
                    let branded =
                        BrandedId::from_stream_id(stream_id).expect("append.lua mints ids within the branded range");
                    (branded.to_string(), false)
                }
                (None, None, None) => {
                    let unexpected = redis::RedisError::from((
                        redis::ErrorKind::Parse,
                        "append.lua returned neither a stream id nor a scheduled id",
                    ));
                    return Err(Error::from_redis(unexpected, "reading append.lua's reply", stream));
                }
            };
            Ok(AppendResponse {
                id,
                stream_id: stream_id.map(|id| id.to_string()).unwrap_or_default(),
                stream: stream.to_owned(),
                duplicate,
                scheduled: stream_id.is_none(),
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    if let [one] = written.as_slice() {
        span.record("messaging.message.id", one.id.as_str());
    }
    if let Some(shortfall) = shortfall {
        return Err(unconfirmed(stream, &written, entries, shortfall));
    }
    Ok(written)
}

/// Indexes `stream` as due at `earliest` after its schedule was written
/// (`ZADD LT`), retried a few times: a failure here leaves the index as the
/// write before the script set it, which a mover may already have raised.
async fn reindex_after_append(streams: &Streams, stream: &str, earliest: u64) {
    for attempt in 1..=3 {
        match scheduled::index(&streams.redis, stream, earliest).await {
            Ok(()) => return,
            Err(error) if attempt == 3 => tracing::error!(
                %stream,
                %error,
                "a scheduled entry was written but its stream could not be indexed; it is moved once this stream is \
                 indexed again (any later scheduled append to it, or a mover that finds it)"
            ),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await,
        }
    }
}

/// UNAVAILABLE for entries the wait did not confirm: which they are, how it
/// fell short, and whether a retry is safe (with each entry's dedup key it
/// is: it answers the same ids and writes nothing).
fn unconfirmed(stream: &str, written: &[AppendResponse], entries: &[NewEntry<'_>], shortfall: Shortfall) -> Error {
    let written_text = match written {
        [one] if one.scheduled => format!("scheduled entry {} of stream `{stream}`", one.id),
        [one] => format!("entry {} (stream id {}) of stream `{stream}`", one.id, one.stream_id),
        [first, .., last] if written.iter().any(|w| w.scheduled) => format!(
            "{} entries of stream `{stream}` (ids {} to {}, {} of them scheduled)",
            written.len(),
            first.id,
            last.id,
            written.iter().filter(|w| w.scheduled).count()
        ),
        [first, .., last] => format!(
            "{} entries of stream `{stream}` (ids {} to {}, stream ids {} to {})",
            written.len(),
            first.id,
            last.id,
            first.stream_id,
            last.stream_id
        ),
        [] => format!("nothing of stream `{stream}`"),
    };
    let keyed = entries.iter().filter(|entry| !entry.dedup_key.is_empty()).count();
    let retry = if keyed == entries.len() {
        "a retry with the same dedup_key is safe: it answers the same ids and writes nothing"
    } else if keyed == 0 {
        "no dedup_key was given, so a retry may write it a second time; set dedup_key to make a retry safe"
    } else {
        "a retry is safe for the entries with a dedup_key; the others may be written a second time"
    };
    Error::Unconfirmed { written: written_text, shortfall: Box::new(shortfall), retry: retry.to_owned() }
}

/// Append: one entry.
pub(super) async fn append(
    streams: &Streams,
    caller: Option<&Caller>,
    traceparent: Option<&str>,
    request: &AppendRequest,
) -> Result<AppendResponse, Error> {
    let entries = [NewEntry {
        batch_index: None,
        fields_field: "fields",
        fields: &request.fields,
        dedup_field: "dedup_key",
        dedup_key: &request.dedup_key,
        due: scheduled::due_of("deliver_at", request.deliver_at, "delay", request.delay, crate::entry::now_unix_ms())?,
    }];
    let mut written = append_entries(
        streams,
        caller,
        traceparent,
        &request.stream,
        &request.partition_key,
        &entries,
        request.max_len,
    )
    .await?;
    let written = written.pop().expect("append.lua returns one id per entry");
    tracing::debug!(stream = %request.stream, id = %written.id, duplicate = written.duplicate, scheduled = written.scheduled, "appended");
    Ok(written)
}

/// AppendBatch: 1 to [`MAX_BATCH_ENTRIES`] entries, all or none.
pub(super) async fn append_batch(
    streams: &Streams,
    caller: Option<&Caller>,
    traceparent: Option<&str>,
    request: &AppendBatchRequest,
) -> Result<AppendBatchResponse, Error> {
    if request.entries.is_empty() || request.entries.len() > MAX_BATCH_ENTRIES {
        return Err(Error::invalid(
            "entries",
            format!("1 to {MAX_BATCH_ENTRIES} entries, got {}", request.entries.len()),
        ));
    }
    let now_ms = crate::entry::now_unix_ms();
    let entries = request
        .entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            let due = scheduled::due_of("entries.deliver_at", entry.deliver_at, "entries.delay", entry.delay, now_ms);
            Ok(NewEntry {
                batch_index: Some(index),
                fields_field: "entries.fields",
                fields: &entry.fields,
                dedup_field: "entries.dedup_key",
                dedup_key: &entry.dedup_key,
                due: due.map_err(|e| e.in_batch_entry(Some(index)))?,
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let (stream, key) = (&request.stream, &request.partition_key);
    let entries = append_entries(streams, caller, traceparent, stream, key, &entries, request.max_len).await?;
    Ok(AppendBatchResponse { entries })
}
