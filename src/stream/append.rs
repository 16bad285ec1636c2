//! Append and AppendBatch: validate → run `append.lua` (mint branded ids and
//! XADD, atomically) → map the stream ids to the response.

use std::collections::HashMap;

use super::Streams;
use crate::{
    error::Error,
    id::{BrandedId, StreamId},
    proto::{AppendBatchRequest, AppendBatchResponse, AppendRequest, AppendResponse},
    redis::{parse_stream_id, parse_unread_trimmed},
    security::Caller,
    telemetry::{self, TRACE_FIELD},
};
use tracing::Instrument;

/// Most entries in one AppendBatch.
pub const MAX_BATCH_ENTRIES: usize = 10_000;

/// Appends `entries` to `stream` in one script run and returns their
/// (branded id, stream id, stream key) in order. A sharded stream's shard is
/// picked by `partition_key` (see [`crate::keys::Keyspace::append_target`]).
/// `max_len` 0: no trimming.
///
/// Errors: [`Error::InvalidArgument`] for a bad stream name (on a cluster, also
/// one no group could consume: see [`crate::keys::Keyspace::consumable`]; a
/// shard key this sidecar does not shard), too many fields,
/// or a field named like the reserved id field; [`Error::Conflict`] for a
/// `max_len` when this sidecar archives or the stream is archived (its
/// `<stream>:archive:through` key exists); [`Error::WrongType`] when the
/// key is not a stream; [`Error::Unavailable`] when Redis is down.
async fn append_entries(
    streams: &Streams,
    caller: Option<&Caller>,
    traceparent: Option<&str>,
    stream: &str,
    partition_key: &str,
    entries: &[(&'static str, &HashMap<String, Vec<u8>>)],
    max_len: u64,
) -> Result<Vec<AppendResponse>, Error> {
    let logical = streams.guard.stream(caller, "stream", stream)?;
    if max_len > 0 && streams.archive.is_some() {
        return Err(Error::Conflict {
            reason: "max_len: this sidecar archives what trims remove (--archive-url), and an Append's max_len \
                     trims inside XADD, before anything could be archived; drop max_len and cap the stream with \
                     --retention NAME=maxlen:N"
                .to_owned(),
        });
    }
    let keys = &streams.redis.keys;
    streams.redis.refuse_foreign_shard_key("stream", logical).await?;
    let target = keys.append_target(logical, partition_key.as_bytes());
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
    let mut script = streams.redis.scripts.append.prepare_invoke();
    script
        .key(stream)
        .key(count_key)
        .key(&through_key)
        .arg(id_field)
        .arg(max_len)
        .arg(target.shard)
        .arg(target.shards)
        .arg(entries.len());
    for (field, fields) in entries {
        if fields.contains_key(id_field) {
            return Err(Error::invalid(
                field,
                format!("`{id_field}` is the reserved field that carries the branded id; rename the field"),
            ));
        }
        if fields.len() > max_fields {
            return Err(Error::invalid(
                field,
                format!("{} fields is more than this sidecar's limit of {max_fields}", fields.len()),
            ));
        }
        // Sorted, so an entry's field order does not depend on hashing.
        let mut sorted: Vec<_> = fields.iter().collect();
        sorted.sort_unstable_by_key(|(name, _)| name.as_str());
        let trace = stored.as_deref().filter(|_| !fields.contains_key(TRACE_FIELD));
        script.arg(sorted.len() + usize::from(trace.is_some()));
        for (name, value) in sorted {
            script.arg(name.as_str()).arg(value.as_slice());
        }
        if let Some(trace) = trace {
            script.arg(TRACE_FIELD).arg(trace);
        }
    }
    let mut conn = streams.redis.conn.clone();
    let reply: redis::Value =
        script.invoke_async(&mut conn).instrument(span.clone()).await.map_err(|e| match e.code() {
            Some("ECHOMQ_SHARDED") => keys.unconfigured_sharded(stream, e.detail().unwrap_or("?")),
            Some("ECHOMQ_ARCHIVED") => Error::Conflict {
                reason: format!(
                    "max_len: stream `{stream}` is archived (`{through_key}` exists), and an Append's max_len trims \
                     inside the append, before anything could be archived; drop max_len and cap the stream with \
                     --retention NAME=maxlen:N on the sidecars that archive it"
                ),
            },
            _ => Error::from_redis(e, "appending (append.lua)", stream),
        })?;
    let redis::Value::Array(reply) = reply else {
        let unexpected = redis::RedisError::from((redis::ErrorKind::Parse, "append.lua did not return a list"));
        return Err(Error::from_redis(unexpected, "appending (append.lua)", stream));
    };
    let [redis::Value::Array(ids), unread] = reply.as_slice() else {
        let unexpected = redis::RedisError::from((redis::ErrorKind::Parse, "append.lua did not return ids and groups"));
        return Err(Error::from_redis(unexpected, "appending (append.lua)", stream));
    };
    // Written, whatever the reply's parsing says next: counted now.
    streams.metrics.appended(stream, keys.sharded_stream_of(stream), ids.len());
    let unread =
        parse_unread_trimmed(unread).map_err(|e| Error::from_redis(e, "reading append.lua's reply", stream))?;
    streams.report_unread_trimmed(stream, &unread, "append_max_len");
    let written = ids
        .iter()
        .map(|id| {
            let stream_id: StreamId =
                parse_stream_id(id).map_err(|e| Error::from_redis(e, "reading append.lua's reply", stream))?;
            let branded = BrandedId::from_stream_id(stream_id).expect("append.lua mints ids within the branded range");
            Ok(AppendResponse { id: branded.to_string(), stream_id: stream_id.to_string(), stream: stream.to_owned() })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    if let [one] = written.as_slice() {
        span.record("messaging.message.id", one.id.as_str());
    }
    Ok(written)
}

/// Append: one entry.
pub(super) async fn append(
    streams: &Streams,
    caller: Option<&Caller>,
    traceparent: Option<&str>,
    request: &AppendRequest,
) -> Result<AppendResponse, Error> {
    let entries = [("fields", &request.fields)];
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
    tracing::debug!(stream = %request.stream, id = %written.id, "appended");
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
    let entries: Vec<_> = request.entries.iter().map(|entry| ("entries.fields", &entry.fields)).collect();
    let (stream, key) = (&request.stream, &request.partition_key);
    let entries = append_entries(streams, caller, traceparent, stream, key, &entries, request.max_len).await?;
    Ok(AppendBatchResponse { entries })
}
