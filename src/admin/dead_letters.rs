//! ListDeadLetters (XRANGE on the dead-letter stream) and ReplayDeadLetters
//! (`replay.lua`: append to the source, then XDEL, atomically).

use redis::Value;

use super::Admin;
use crate::{
    durable::{run, ScriptCall, ScriptName},
    entry::{self, dead_letter_fields as fields},
    error::Error,
    id::StreamId,
    proto::{
        DeadLetter, ListDeadLettersRequest, ListDeadLettersResponse, ReplayDeadLettersRequest,
        ReplayDeadLettersResponse, Replayed,
    },
    redis::{
        array, bytes, parse_stream_id,
        range::{page, page_size},
    },
    security::Caller,
};

/// Dead letters moved back per script run, so one run never blocks Redis long.
const REPLAY_BATCH: usize = 100;

/// The metadata fields the dead-letter step writes into a dead letter.
fn is_metadata(name: &[u8]) -> bool {
    name.starts_with(fields::PREFIX.as_bytes())
}

/// The dead-letter stream named by a request: given (checked against the
/// limits and the allow-list itself), or the stream's default (`<stream>:dlq`,
/// tagged on a cluster), which belongs to the stream: allowed with it, and
/// not held to the name limit (a stream at the limit has a longer one). A
/// sharded stream's name is refused: each shard has its own.
async fn dead_letter_stream(
    admin: &Admin,
    caller: Option<&Caller>,
    stream: &str,
    given: &str,
) -> Result<String, Error> {
    if !given.is_empty() {
        return Ok(admin.guard.stream(caller, "dead_letter_stream", given)?.to_owned());
    }
    let stream = admin.guard.stream(caller, "stream", stream)?;
    admin.redis.refuse_sharded("stream", stream).await?;
    Ok(admin.redis.keys.dead_letter_stream(stream))
}

/// ListDeadLetters: a page, oldest first.
pub(super) async fn list(
    admin: &Admin,
    caller: Option<&Caller>,
    request: &ListDeadLettersRequest,
) -> Result<ListDeadLettersResponse, Error> {
    let dead_letters = dead_letter_stream(admin, caller, &request.stream, &request.dead_letter_stream).await?;
    let start = match request.start_id.as_str() {
        "" => "-".to_owned(),
        id => id.parse::<StreamId>().map_err(|e| Error::invalid("start_id", e.to_string()))?.to_string(),
    };
    let count = page_size("count", request.count)?;
    let page = page(&admin.redis, &dead_letters, &start, "+", count, admin.guard.max_message_bytes).await?;
    let dead_letters = page
        .entries
        .into_iter()
        .filter_map(|raw| {
            let meta = |name: &str| {
                raw.fields
                    .as_ref()?
                    .iter()
                    .find(|(n, _)| n == name.as_bytes())
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            };
            let (source_stream, source_id, group, attempts, reason, at) = (
                meta(fields::SOURCE_STREAM).unwrap_or_default(),
                meta(fields::SOURCE_ID).unwrap_or_default(),
                meta(fields::GROUP).unwrap_or_default(),
                meta(fields::ATTEMPTS).and_then(|a| a.parse().ok()).unwrap_or(0),
                meta(fields::REASON).unwrap_or_default(),
                meta(fields::DEAD_LETTERED_AT_MS).and_then(|a| a.parse().ok()),
            );
            Some(DeadLetter {
                entry: Some(entry::to_entry(raw, &admin.id_field, is_metadata)?),
                source_stream,
                source_id,
                group,
                attempts,
                reason,
                dead_lettered_at: at.map(entry::timestamp),
            })
        })
        .collect();
    Ok(ListDeadLettersResponse { dead_letters, next_start_id: page.next_start_id, oversized_ids: page.oversized_ids })
}

/// ReplayDeadLetters: the given ids, or the oldest `count`.
pub(super) async fn replay(
    admin: &Admin,
    caller: Option<&Caller>,
    request: &ReplayDeadLettersRequest,
) -> Result<ReplayDeadLettersResponse, Error> {
    let source = admin.guard.stream(caller, "stream", &request.stream)?;
    if !request.dead_letter_stream.is_empty() {
        // Without one, finding the default dead-letter stream checks this.
        admin.redis.refuse_sharded("stream", source).await?;
    }
    let dead_letters = dead_letter_stream(admin, caller, source, &request.dead_letter_stream).await?;
    admin.redis.keys.same_slot("dead_letter_stream", source, &dead_letters)?;
    if dead_letters == source {
        return Err(Error::invalid("dead_letter_stream", "must differ from the stream the dead letters go back to"));
    }
    let mut conn = admin.redis.conn.clone();
    let ids: Vec<String> = if request.ids.is_empty() {
        let count = page_size("count", request.count)?;
        // Only the ids are needed: no message-size budget applies.
        let oldest = page(&admin.redis, &dead_letters, "-", "+", count, usize::MAX).await?;
        oldest.entries.into_iter().map(|e| e.id.to_string()).collect()
    } else {
        let mut seen = std::collections::HashSet::new();
        let mut ids = Vec::with_capacity(request.ids.len());
        for id in &request.ids {
            let id = id.parse::<StreamId>().map_err(|e| Error::invalid("ids", e.to_string()))?.to_string();
            if seen.insert(id.clone()) {
                ids.push(id);
            }
        }
        ids
    };
    let mut replayed = Vec::with_capacity(ids.len());
    let mut other_source_ids = Vec::new();
    let mut progress = ReplayProgress {
        stream: source,
        dead_letters: &dead_letters,
        replayed: 0,
        under_way: 0,
        finished: false,
        stopped_by: None,
    };
    for batch in ids.chunks(REPLAY_BATCH) {
        let mut script = ScriptCall::new(&admin.redis, ScriptName::Replay, &[source, dead_letters.as_str()]);
        script.arg(&admin.id_field);
        for id in batch {
            script.arg(id);
        }
        progress.under_way = batch.len();
        let ran = run(&admin.redis, &mut conn, admin.writes.durable.as_ref(), script).await;
        let (reply, shortfall): (Value, _) = match ran {
            Ok(ran) => ran,
            Err(e) => {
                progress.stopped_by = Some(e.to_string());
                return Err(replay_error(e, source, replayed.len()));
            }
        };
        let (moved, other_source) = match array(&reply) {
            [moved, other_source] => (array(moved), array(other_source)),
            _ => (&[][..], &[][..]),
        };
        other_source_ids.extend(other_source.iter().filter_map(|id| parse_stream_id(id).ok()).map(|id| id.to_string()));
        for item in moved {
            let parts = array(item);
            let (Some(Ok(dead_letter_id)), Some(Ok(stream_id))) =
                (parts.first().map(parse_stream_id), parts.get(1).map(parse_stream_id))
            else {
                continue;
            };
            let id = parts.get(2).and_then(|v| bytes(v).ok()).map(|b| String::from_utf8_lossy(&b).into_owned());
            replayed.push(Replayed {
                id: id.filter(|id| !id.is_empty()).unwrap_or_else(|| {
                    crate::id::BrandedId::from_stream_id(stream_id).map(|b| b.to_string()).unwrap_or_default()
                }),
                dead_letter_id: dead_letter_id.to_string(),
                stream_id: stream_id.to_string(),
            });
        }
        progress.replayed = replayed.len();
        progress.under_way = 0;
        if let Some(shortfall) = shortfall {
            // Moved on the primary; the next batches wait until it is confirmed.
            let batch_moved = array(&reply).first().map_or(0, |moved| array(moved).len());
            progress.stopped_by = Some(format!("not confirmed: {shortfall}"));
            return Err(Error::Unconfirmed {
                written: format!(
                    "a batch of {batch_moved} dead letters replayed to stream `{source}` ({} replayed in all, \
                     the last with stream id {})",
                    replayed.len(),
                    replayed.last().map_or("-", |r| r.stream_id.as_str())
                ),
                shortfall: Box::new(shortfall),
                retry: "replaying again is safe: a replayed dead letter left the dead-letter stream and is not \
                        moved twice"
                    .to_owned(),
            });
        }
    }
    progress.finished = true;
    // Only ids the request named can be missing; the oldest-`count` page found its own.
    let not_found_ids = if request.ids.is_empty() {
        Vec::new()
    } else {
        let done: std::collections::HashSet<&str> = replayed
            .iter()
            .map(|r| r.dead_letter_id.as_str())
            .chain(other_source_ids.iter().map(String::as_str))
            .collect();
        ids.iter().filter(|id| !done.contains(id.as_str())).cloned().collect()
    };
    tracing::info!(
        stream = %source, %dead_letters, replayed = replayed.len(), other_source = other_source_ids.len(),
        "dead letters replayed"
    );
    Ok(ReplayDeadLettersResponse { replayed, not_found_ids, other_source_ids })
}

/// The error for a `replay.lua` run that failed after `before` dead letters
/// were replayed by earlier batches: FAILED_PRECONDITION when the source
/// stream cannot take them (no stream, no group: ECHOMQ_NO_SOURCE,
/// ECHOMQ_NO_GROUP), CONFLICT for a dead letter with nothing but metadata
/// (ECHOMQ_EMPTY), else as [`Error::from_redis`].
fn replay_error(e: redis::RedisError, source: &str, before: usize) -> Error {
    let before = match before {
        0 => String::new(),
        n => format!(" ({n} were replayed before this batch of {REPLAY_BATCH} stopped)"),
    };
    let missing = match e.code() {
        Some("ECHOMQ_NO_SOURCE") => "does not exist",
        Some("ECHOMQ_NO_GROUP") => "has no consumer group",
        Some("ECHOMQ_EMPTY") => {
            let id = e.detail().unwrap_or("?");
            return Error::Conflict {
                reason: format!(
                    "dead letter {id} has no fields but `echomq.*` metadata, so it cannot be appended{before}; \
                     delete it (XDEL) or replay the others by id"
                ),
            };
        }
        _ => return Error::from_redis(e, format!("replaying dead letters (replay.lua){before}"), source),
    };
    Error::Conflict {
        reason: format!(
            "stream `{source}` {missing}{before}, so replayed entries would reach no consumer (a group \
             created later at `$` would skip them); start its consumers (subscribe creates the stream \
             and group) and replay again"
        ),
    }
}

/// Logs a replay that stopped part-way, whether a batch failed or the caller
/// went away (tonic drops the call's future): the batches already run stay
/// replayed (each batch of [`REPLAY_BATCH`] is one atomic script run).
struct ReplayProgress<'a> {
    stream: &'a str,
    dead_letters: &'a str,
    /// Dead letters replayed so far (their batches' replies came back).
    replayed: usize,
    /// Dead letters in the batch sent and not yet answered: if the caller
    /// goes away then, Redis may still run it.
    under_way: usize,
    finished: bool,
    /// The Redis error that stopped it, if one did.
    stopped_by: Option<String>,
}

impl Drop for ReplayProgress<'_> {
    fn drop(&mut self) {
        if self.finished || self.replayed + self.under_way == 0 {
            return;
        }
        let (cause, under_way) = match &self.stopped_by {
            Some(error) => (error.as_str(), 0),
            None => ("the caller went away (cancelled, or its deadline passed)", self.under_way),
        };
        tracing::warn!(
            stream = %self.stream, dead_letters = %self.dead_letters, replayed = self.replayed, under_way,
            "replay stopped part-way: {cause}; what was replayed stays replayed, and the `under_way` batch \
             (sent, not answered) may have been replayed too"
        );
    }
}
