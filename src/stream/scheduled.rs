//! Scheduled entries: Append's `deliver_at`/`delay`, CancelScheduled,
//! ListScheduled, and the mover that puts due entries into their streams.
//!
//! Where they live, all in the stream key's slot: the schedule
//! `<stream>:scheduled` (a sorted set: branded id by due unix ms) and the
//! entries `<stream>:scheduled:entries` (a hash: branded id → fields). An
//! entry's branded id is minted at the append (`append.lua`, which also
//! reserves it with `XSETID`), and `move.lua` writes the entry with it when it
//! is due, removing it from the schedule in the same step: so a sidecar killed
//! mid-move leaves each entry moved once or still scheduled, never both.
//!
//! Finding due streams without anyone appending to or consuming them: every
//! sidecar polls the index [`SCHEDULED_INDEX`] (stream key by the unix ms its
//! earliest entry is due, or earlier): every `--schedule-poll-ms` while
//! streams are due; idle, at the earliest due time it holds, at a due time
//! this sidecar scheduled ([`MoverWake`]), or after
//! `--schedule-idle-poll-ms`, whichever is first. On a cluster
//! the index has a slot of its own, so it is written by separate commands,
//! ordered so that no schedule is left out of it:
//! - an append indexes the stream (`ZADD … LT`, never later than it was)
//!   before its script writes the schedule (so a sidecar killed right after
//!   the script leaves the stream indexed), and again after it with the exact
//!   due time (so a mover that read the schedule in between and raised or
//!   removed the index is corrected);
//! - a mover, under the stream's move lease, sets the index to the next due
//!   time the move script returned (or removes the stream when none), then
//!   reads the schedule's first due time again and lowers the index to it
//!   (`ZADD … LT`): an append that wrote meanwhile is indexed either way.
//!
//! An index score earlier than the schedule's first entry only costs a move
//! that moves nothing and corrects it.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use prost_types::Timestamp;
use tokio::sync::Notify;

use super::Streams;
use crate::{
    consume::subscribe::{duration, MAX_DURATION},
    entry::{now_unix_ms, timestamp, unix_ms_of},
    error::Error,
    id::BrandedId,
    keys::SCHEDULED_INDEX,
    proto::{
        CancelScheduledRequest, CancelScheduledResponse, ListScheduledRequest, ListScheduledResponse, ScheduledEntry,
    },
    redis::{array, bytes, range::page_size, Redis},
    security::Caller,
};

/// As [`Error::from_redis`], but a WRONGTYPE names the stream's schedule
/// keys too: a step on scheduled entries touches the stream, its schedule
/// (a sorted set) and its entries (a hash), and any may be the wrong one.
pub(crate) fn from_redis_scheduled(error: redis::RedisError, doing: &str, redis: &Redis, stream: &str) -> Error {
    match Error::from_redis(error, doing, stream) {
        Error::WrongType { .. } => Error::Conflict {
            reason: format!(
                "key `{stream}` (a stream), `{}` (a sorted set) or `{}` (a hash) holds another Redis type; \
                 pick another stream, or delete the key of the wrong type",
                redis.keys.scheduled(stream),
                redis.keys.scheduled_entries(stream)
            ),
        },
        other => other,
    }
}

/// When an entry to append is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Due {
    /// Appended at once (no `deliver_at`/`delay`, a zero delay).
    Now,
    /// At this unix ms (`deliver_at`; at or before the Redis clock: at once).
    At(u64),
    /// This many ms after the Redis time of the append (`delay`).
    After(u64),
}

impl Due {
    /// The script's two numbers: when (unix ms) and how long after now (ms); 0 for neither.
    pub(super) fn args(self) -> (u64, u64) {
        match self {
            Due::Now => (0, 0),
            Due::At(ms) => (ms, 0),
            Due::After(ms) => (0, ms),
        }
    }

    /// About when it is due by this sidecar's clock (`now_ms`), for the index
    /// before the append; `None` when appended at once.
    pub(super) fn estimate(self, now_ms: u64) -> Option<u64> {
        match self {
            Due::Now => None,
            Due::At(ms) => Some(ms),
            Due::After(ms) => Some(now_ms.saturating_add(ms)),
        }
    }
}

/// When an entry with `deliver_at` (request field `at_field`) or `delay`
/// (`delay_field`) is due, at `now_ms` by this sidecar's clock.
///
/// Errors: [`Error::InvalidArgument`] for both given, a negative or malformed
/// delay, a malformed instant (nanos outside 0 to 999,999,999), or either more
/// than [`MAX_DURATION`] (365 days) ahead. An instant in the past (before the
/// epoch too) is fine: the entry is appended at once.
pub(super) fn due_of(
    at_field: &'static str,
    at: Option<Timestamp>,
    delay_field: &'static str,
    delay: Option<prost_types::Duration>,
    now_ms: u64,
) -> Result<Due, Error> {
    let horizon = MAX_DURATION.as_millis() as u64;
    match (at, delay) {
        (Some(_), Some(_)) => Err(Error::invalid(
            at_field,
            format!("give {at_field} or {delay_field}, not both: one says when the entry is due"),
        )),
        (Some(at), None) if at.seconds < 0 && (0..1_000_000_000).contains(&at.nanos) => Ok(Due::At(1)),
        (Some(at), None) => {
            let ms = unix_ms_of(at_field, at)?;
            if ms > now_ms.saturating_add(horizon) {
                return Err(Error::invalid(
                    at_field,
                    format!(
                        "{} s after the unix epoch is more than 365 days after this sidecar's clock ({} s), the \
                         horizon of scheduled entries; schedule it nearer, and again from there",
                        at.seconds,
                        now_ms / 1000
                    ),
                ));
            }
            Ok(Due::At(ms.max(1)))
        }
        (None, Some(delay)) => match duration(delay_field, Some(delay))? {
            Some(d) if d.as_millis() > 0 => Ok(Due::After(d.as_millis() as u64)),
            _ => Ok(Due::Now),
        },
        (None, None) => Ok(Due::Now),
    }
}

/// Indexes the stream key `stream` as due at `due_ms` at the latest
/// (`ZADD echomq:scheduled-index LT`: an earlier score stays).
///
/// Errors: as [`Error::from_redis`].
pub(super) async fn index(redis: &Redis, stream: &str, due_ms: u64) -> Result<(), Error> {
    let mut conn = redis.conn.clone();
    let _: i64 = redis::cmd("ZADD")
        .arg(SCHEDULED_INDEX)
        .arg("LT")
        .arg(due_ms)
        .arg(stream)
        .query_async(&mut conn)
        .await
        .map_err(|e| Error::from_redis(e, "indexing a schedule (ZADD LT)", stream))?;
    Ok(())
}

/// The unix ms the first entry of `stream`'s schedule is due at, `None` when
/// it has none (`ZRANGE <stream>:scheduled 0 0 WITHSCORES`).
///
/// Errors: as [`Error::from_redis`].
pub(crate) async fn first_due(redis: &Redis, stream: &str) -> Result<Option<u64>, Error> {
    let mut conn = redis.conn.clone();
    let first: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(redis.keys.scheduled(stream))
        .arg(0)
        .arg(0)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .map_err(|e| Error::from_redis(e, "reading a schedule (ZRANGE)", stream))?;
    Ok(first.first().map(|(_, score)| *score as u64))
}

/// The stream key a CancelScheduled or ListScheduled names: checked like a
/// Read's (the allow-list, a sharded stream's name refused).
async fn stream_key<'a>(streams: &Streams, caller: Option<&Caller>, name: &'a str) -> Result<&'a str, Error> {
    let stream = streams.guard.stream(caller, "stream", name)?;
    streams.redis.refuse_sharded("stream", stream).await?;
    Ok(stream)
}

/// CancelScheduled: removes the entry from the schedule (`cancel.lua`).
///
/// Errors: [`Error::InvalidArgument`] for a bad stream name or id;
/// [`Error::NotFound`] when it is not scheduled (moved, cancelled, never);
/// [`Error::Unavailable`] when Redis is down.
pub(super) async fn cancel(
    streams: &Streams,
    caller: Option<&Caller>,
    request: &CancelScheduledRequest,
) -> Result<CancelScheduledResponse, Error> {
    let stream = stream_key(streams, caller, &request.stream).await?;
    let id: BrandedId = request.id.parse().map_err(|e: crate::id::IdParseError| Error::invalid("id", e.to_string()))?;
    let keys = &streams.redis.keys;
    let mut conn = streams.redis.conn.clone();
    let due: Option<String> = streams
        .redis
        .scripts
        .cancel_scheduled
        .key(keys.scheduled(stream))
        .key(keys.scheduled_entries(stream))
        .arg(id.to_string())
        .invoke_async(&mut conn)
        .await
        .map_err(|e| from_redis_scheduled(e, "cancelling a scheduled entry (cancel.lua)", &streams.redis, stream))?;
    let Some(due) = due else {
        return Err(Error::NotFound {
            what: format!(
                "scheduled entry {id} on stream `{stream}` (it entered the stream already, was cancelled, or was \
                 scheduled on another stream key: see AppendResponse.stream)"
            ),
        });
    };
    tracing::debug!(%stream, %id, "scheduled entry cancelled");
    Ok(CancelScheduledResponse { deliver_at: Some(timestamp(due.parse::<f64>().unwrap_or(0.0) as u64)) })
}

/// ListScheduled: a page by due time then branded id (`list_scheduled.lua`).
///
/// Errors: [`Error::InvalidArgument`] for a bad stream name, page token or
/// count; [`Error::Unavailable`] when Redis is down.
pub(super) async fn list(
    streams: &Streams,
    caller: Option<&Caller>,
    request: &ListScheduledRequest,
) -> Result<ListScheduledResponse, Error> {
    let stream = stream_key(streams, caller, &request.stream).await?;
    let count = page_size("count", request.count)?;
    let (after_due, after_id) = match request.page_token.as_str() {
        "" => (String::new(), String::new()),
        token => parse_page_token(token)?,
    };
    let keys = &streams.redis.keys;
    let mut conn = streams.redis.conn.clone();
    let reply: redis::Value = streams
        .redis
        .scripts
        .list_scheduled
        .key(keys.scheduled(stream))
        .key(keys.scheduled_entries(stream))
        .arg(&after_due)
        .arg(&after_id)
        .arg(count)
        .invoke_async(&mut conn)
        .await
        .map_err(|e| {
            from_redis_scheduled(e, "listing scheduled entries (list_scheduled.lua)", &streams.redis, stream)
        })?;
    let parsed = || -> redis::RedisResult<(u64, Vec<ScheduledEntry>)> {
        let [total, items] = array(&reply) else {
            return Err((redis::ErrorKind::Parse, "list_scheduled.lua did not return a total and entries").into());
        };
        let total = crate::redis::int(total)? as u64;
        let mut entries = Vec::new();
        for item in array(items) {
            let [id, due, fields] = array(item) else {
                return Err((redis::ErrorKind::Parse, "list_scheduled.lua returned a malformed entry").into());
            };
            let due = String::from_utf8_lossy(&bytes(due)?).parse::<f64>().unwrap_or(0.0) as u64;
            let mut map = std::collections::HashMap::new();
            for pair in array(fields).chunks(2) {
                if let [name, value] = pair {
                    map.insert(String::from_utf8_lossy(&bytes(name)?).into_owned(), bytes(value)?);
                }
            }
            entries.push(ScheduledEntry {
                id: String::from_utf8_lossy(&bytes(id)?).into_owned(),
                deliver_at: Some(timestamp(due)),
                fields: map,
            });
        }
        Ok((total, entries))
    };
    let (total, mut entries) =
        parsed().map_err(|e| Error::from_redis(e, "reading list_scheduled.lua's reply", stream))?;
    let next_page_token = if entries.len() > count {
        entries.truncate(count);
        entries.last().map(|last| {
            let due = last.deliver_at.map_or(0, |at| at.seconds as u64 * 1000 + at.nanos as u64 / 1_000_000);
            format!("{due}-{}", last.id)
        })
    } else {
        None
    };
    Ok(ListScheduledResponse { entries, next_page_token: next_page_token.unwrap_or_default(), total })
}

/// `<due unix ms>-<branded id>` → the two, checked.
fn parse_page_token(token: &str) -> Result<(String, String), Error> {
    let bad = || {
        Error::invalid("page_token", format!("`{token}` is not a page token; pass a previous page's next_page_token"))
    };
    let (due, id) = token.split_once('-').ok_or_else(bad)?;
    let due: u64 = due.parse().map_err(|_| bad())?;
    let id: BrandedId = id.parse().map_err(|_| bad())?;
    Ok((due.to_string(), id.to_string()))
}

/// How long a mover holds a stream's move lease before another may take it
/// (ms): far above a move step's time, so it only matters after a crash.
pub const MOVE_LEASE_MS: u64 = 10_000;

/// Most entries one `move.lua` step moves: a step blocks Redis for about
/// this many XADDs (a few ms), and a stream with more due moves in several.
pub const MOVE_STEP: usize = 1_000;

/// Most due streams one poll takes from the index.
const STREAMS_PER_POLL: usize = 64;

/// What a mover needs: Redis, the reserved field, how writes are confirmed.
pub struct Mover {
    /// The connections and keyspace.
    pub redis: Redis,
    /// The reserved field that carries the branded id.
    pub id_field: String,
    /// Durable writes (`--wait-replicas`/`--wait-aof`): each move step is
    /// confirmed like an append; a shortfall is logged (the entries are on
    /// the primary, moved once).
    pub writes: crate::durable::Writes,
    /// This sidecar's name, in lease tokens.
    pub owner: String,
    /// Where moved entries are counted (`echomq_appends_total`).
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// When each failing stream was last warned about: a stream whose move
    /// keeps failing (its key turned into another type) is retried every
    /// poll, and warned about once a minute.
    pub warned: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

/// How often a stream whose move keeps failing is warned about.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Wakes this sidecar's mover for an entry it scheduled: at the entry's due
/// time, instead of at its next idle poll. Cloned into the append path
/// ([`Streams`]) and the mover ([`run`]).
#[derive(Clone, Debug, Default)]
pub struct MoverWake(std::sync::Arc<WakeState>);

#[derive(Debug)]
struct WakeState {
    /// The earliest due time (unix ms) asked for since the mover last looked;
    /// `u64::MAX` for none.
    earliest: AtomicU64,
    notify: Notify,
}

impl Default for WakeState {
    fn default() -> WakeState {
        WakeState { earliest: AtomicU64::new(u64::MAX), notify: Notify::new() }
    }
}

impl MoverWake {
    /// Asks the mover to poll at `due_ms` (unix ms) at the latest.
    pub(super) fn at(&self, due_ms: u64) {
        self.0.earliest.fetch_min(due_ms, Ordering::Relaxed);
        self.0.notify.notify_one();
    }

    /// The earliest due time asked for since the last call, if any.
    fn take(&self) -> Option<u64> {
        Some(self.0.earliest.swap(u64::MAX, Ordering::Relaxed)).filter(|&due| due != u64::MAX)
    }
}

/// Moves due entries until `stopping` turns true. While streams are due it
/// polls the index every `poll`; idle, it sleeps until the earliest due time
/// the index holds, or until `wake` says this sidecar scheduled an entry due
/// sooner, but at most `idle_poll` (another sidecar may schedule one due
/// sooner and be gone by then) and at least `poll`. Errors are logged and
/// retried after `poll`.
pub async fn run(
    mover: Mover,
    poll: Duration,
    idle_poll: Duration,
    wake: MoverWake,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let idle_poll = idle_poll.max(poll);
    let mut next = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = wake.0.notify.notified() => {
                if let Some(due_ms) = wake.take() {
                    let until = Duration::from_millis(due_ms.saturating_sub(now_unix_ms()));
                    next = next.min(tokio::time::Instant::now() + until.max(poll));
                }
                continue;
            }
            _ = stopping.wait_for(|stop| *stop) => return,
        }
        let sleep = match mover.poll().await {
            Ok(Polled { due: true, .. }) => poll,
            Ok(Polled { next_due_in: Some(wait), .. }) => wait.clamp(poll, idle_poll),
            Ok(Polled { next_due_in: None, .. }) => idle_poll,
            Err(error) => {
                tracing::debug!(%error, "moving scheduled entries failed; retrying next poll");
                poll
            }
        };
        next = tokio::time::Instant::now() + sleep;
    }
}

/// What one poll found.
#[derive(Debug)]
pub struct Polled {
    /// Entries moved.
    pub moved: usize,
    /// Whether any stream was due (more may be: poll again soon).
    pub due: bool,
    /// How long until the index's earliest due time, on the Redis clock;
    /// `None` when the index is empty.
    pub next_due_in: Option<Duration>,
}

impl Mover {
    /// One poll: the due streams (`due_streams.lua`), each moved in turn (a
    /// stream that fails is logged and tried again next poll), and how long
    /// until the next is due.
    ///
    /// Errors: as [`Error::from_redis`] when the index cannot be read.
    pub async fn poll(&self) -> Result<Polled, Error> {
        let mut conn = self.redis.conn.clone();
        let (due, wait_ms): (Vec<(String, String)>, i64) = self
            .redis
            .scripts
            .due_streams
            .key(SCHEDULED_INDEX)
            .arg(STREAMS_PER_POLL)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| Error::from_redis(e, "finding due schedules (due_streams.lua)", SCHEDULED_INDEX))?;
        let mut moved = 0;
        for (stream, _) in &due {
            // One stream's failure (a key of another type, say) holds up no other.
            match self.move_stream(stream).await {
                Ok(n) => moved += n,
                Err(error) => self.warn(stream, &error),
            }
        }
        let next_due_in = u64::try_from(wait_ms).ok().map(Duration::from_millis);
        Ok(Polled { moved, due: !due.is_empty(), next_due_in })
    }

    /// Warns that `stream`'s move failed, once per [`WARN_EVERY`] per stream
    /// (debug in between).
    fn warn(&self, stream: &str, error: &Error) {
        let now = std::time::Instant::now();
        let mut warned = self.warned.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        warned.retain(|_, at| now.duration_since(*at) < WARN_EVERY);
        if warned.contains_key(stream) {
            tracing::debug!(%stream, %error, "moving scheduled entries failed again; retrying next poll");
        } else {
            warned.insert(stream.to_owned(), now);
            tracing::warn!(%stream, %error, "moving scheduled entries failed; retrying every poll, warning again in a minute if it still fails");
        }
    }

    /// Moves `stream`'s due entries under its move lease (skipped when another
    /// sidecar holds it), then re-indexes it. Returns the entries moved.
    ///
    /// Errors: as [`Error::from_redis`].
    pub async fn move_stream(&self, stream: &str) -> Result<usize, Error> {
        let keys = &self.redis.keys;
        let lease = keys.scheduled_lease(stream);
        let token = format!("{}:{}:{}", self.owner, std::process::id(), now_unix_ms());
        if !super::fold::take_lease(&self.redis, &lease, &token, MOVE_LEASE_MS, stream).await? {
            return Ok(0);
        }
        let moved = self.move_due(stream).await;
        let mut conn = self.redis.conn.clone();
        super::fold::release(&mut conn, &self.redis.scripts.lease_release, &lease, &token).await;
        moved
    }

    /// The move steps and the re-indexing, with the lease held.
    async fn move_due(&self, stream: &str) -> Result<usize, Error> {
        let keys = &self.redis.keys;
        let sharded_stream = keys.sharded_stream_of(stream);
        let mut moved = 0;
        let next = loop {
            let mut call = crate::durable::ScriptCall::new(
                &self.redis,
                crate::durable::ScriptName::Move,
                &[stream.to_owned(), keys.scheduled(stream), keys.scheduled_entries(stream)],
            );
            call.arg(&self.id_field).arg(MOVE_STEP);
            let mut conn = self.redis.conn.clone();
            let (reply, shortfall) = crate::durable::run(&self.redis, &mut conn, self.writes.durable.as_ref(), call)
                .await
                .map_err(|e| from_redis_scheduled(e, "moving scheduled entries (move.lua)", &self.redis, stream))?;
            if let Some(shortfall) = shortfall {
                tracing::warn!(%stream, ?shortfall, "scheduled entries moved into the stream on the primary, not confirmed by replicas in time");
            }
            let [step, next] = array(&reply) else {
                let unexpected =
                    redis::RedisError::from((redis::ErrorKind::Parse, "move.lua did not return two items"));
                return Err(Error::from_redis(unexpected, "reading move.lua's reply", stream));
            };
            let step = array(step).len() / 2;
            moved += step;
            if step > 0 {
                self.metrics.streams.appended(stream, sharded_stream, step);
                tracing::debug!(%stream, moved = step, "scheduled entries entered the stream");
            }
            let next = match next {
                redis::Value::Nil | redis::Value::Boolean(false) => None,
                next => Some(
                    String::from_utf8_lossy(
                        &bytes(next).map_err(|e| Error::from_redis(e, "reading move.lua's reply", stream))?,
                    )
                    .parse::<f64>()
                    .unwrap_or(0.0) as u64,
                ),
            };
            if step < MOVE_STEP {
                break next;
            }
        };
        self.reindex(stream, next).await?;
        Ok(moved)
    }

    /// Sets the index to `next` (or removes `stream` when `None`), then lowers
    /// it to the schedule's first due time read afterwards.
    async fn reindex(&self, stream: &str, next: Option<u64>) -> Result<(), Error> {
        let mut conn = self.redis.conn.clone();
        let set: redis::RedisResult<i64> = match next {
            Some(due) => redis::cmd("ZADD").arg(SCHEDULED_INDEX).arg(due).arg(stream).query_async(&mut conn).await,
            None => redis::cmd("ZREM").arg(SCHEDULED_INDEX).arg(stream).query_async(&mut conn).await,
        };
        set.map_err(|e| Error::from_redis(e, "indexing a schedule (ZADD/ZREM)", stream))?;
        if let Some(first) = first_due(&self.redis, stream).await? {
            index(&self.redis, stream, first).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_times_are_checked() {
        let now = 1_000_000;
        let at = |seconds, nanos| Some(Timestamp { seconds, nanos });
        let delay = |seconds, nanos| Some(prost_types::Duration { seconds, nanos });
        assert_eq!(due_of("a", None, "d", None, now).unwrap(), Due::Now);
        assert_eq!(due_of("a", at(2_000, 5_000_000), "d", None, now).unwrap(), Due::At(2_000_005));
        assert_eq!(due_of("a", at(1, 0), "d", None, now).unwrap(), Due::At(1_000), "the past: at once, in the script");
        assert_eq!(due_of("a", at(-5, 0), "d", None, now).unwrap(), Due::At(1), "before the epoch is the past");
        assert_eq!(due_of("a", None, "d", delay(0, 0), now).unwrap(), Due::Now);
        assert_eq!(due_of("a", None, "d", delay(1, 500_000_000), now).unwrap(), Due::After(1_500));
        assert!(due_of("a", at(2_000, 0), "d", delay(1, 0), now).is_err(), "both");
        assert!(due_of("a", None, "d", delay(-1, 0), now).is_err(), "negative");
        assert!(due_of("a", None, "d", delay(366 * 86_400, 0), now).is_err(), "beyond the horizon");
        assert!(due_of("a", at(1_000 + 366 * 86_400, 0), "d", None, now).is_err(), "beyond the horizon");
        assert!(due_of("a", at(1_000 + 364 * 86_400, 0), "d", None, now).is_ok());
        assert!(due_of("a", at(2_000, -1), "d", None, now).is_err(), "malformed");
    }

    #[test]
    fn page_tokens_round_trip() {
        let (due, id) = parse_page_token("1700000000000-0000000000010000000000000000").unwrap();
        assert_eq!((due.as_str(), id.as_str()), ("1700000000000", "0000000000010000000000000000"));
        for bad in ["", "x", "1-x", "x-0000000000010000000000000000"] {
            assert!(parse_page_token(bad).is_err(), "{bad}");
        }
    }
}
