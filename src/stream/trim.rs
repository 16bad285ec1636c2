//! Trim: validate exactly one bound → `trim.lua` (safe bound and XTRIM MINID,
//! atomically) → what was removed.

use super::Streams;
use crate::{
    archive::fold::{Asked, Folding},
    error::Error,
    id::StreamId,
    proto::{TrimRequest, TrimResponse},
    redis::{bytes, parse_unread_trimmed, Redis, UnreadTrimmed},
    security::Caller,
};

/// Trim: by length, by id, or before an instant; safe unless `ignore_groups`.
pub(super) async fn trim(
    streams: &Streams,
    caller: Option<&Caller>,
    request: &TrimRequest,
) -> Result<TrimResponse, Error> {
    let stream = streams.guard.stream(caller, "stream", &request.stream)?;
    streams.redis.refuse_sharded("stream", stream).await?;
    let bounds = [request.max_len > 0, !request.min_id.is_empty(), request.before.is_some()];
    if bounds.iter().filter(|set| **set).count() != 1 {
        return Err(Error::invalid("max_len", "give exactly one of max_len, min_id and before"));
    }
    let bound = if request.max_len > 0 {
        Bound::KeepNewest(request.max_len)
    } else if let Some(before) = request.before {
        Bound::Below(StreamId { ms: crate::entry::unix_ms_of("before", before)?, seq: 0 })
    } else {
        Bound::Below(request.min_id.parse::<StreamId>().map_err(|e| Error::invalid("min_id", e.to_string()))?)
    };
    let trim = Trim { bound, approximate: request.approximate, safe: !request.ignore_groups };
    let (Trimmed { trimmed, applied_min_id, held_back, unread }, archived) =
        trim_stream(&streams.redis, streams.archive.as_deref(), stream, &trim, Asked::ByTrim).await?;
    streams.report_unread_trimmed(stream, &unread, "trim");
    if held_back {
        tracing::info!(%stream, %applied_min_id, "trim held back to keep entries that groups still need");
    }
    Ok(TrimResponse { trimmed, applied_min_id, held_back_by_groups: held_back, archived })
}

/// Trims `stream`; with an archive (`folding`), folds what the trim removes
/// first (for retention, whole files only, see [`Asked`]). Returns the trim
/// and how many entries it archived. Trim calls and the retention policies
/// both trim through here.
///
/// Errors: as [`run`] and [`Folding::fold_then_trim`].
pub(crate) async fn trim_stream(
    redis: &Redis,
    folding: Option<&Folding>,
    stream: &str,
    trim: &Trim,
    asked: Asked,
) -> Result<(Trimmed, u64), Error> {
    match folding {
        Some(folding) => folding.fold_then_trim(redis, stream, trim, asked).await,
        None => Ok((run(redis, stream, trim, None, false).await?, 0)),
    }
}

/// Where a trim stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bound {
    /// Keep the newest N entries.
    KeepNewest(u64),
    /// Remove the entries below this id (XTRIM MINID).
    Below(StreamId),
}

/// One trim, as `trim.lua` applies it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Trim {
    pub(crate) bound: Bound,
    /// `MINID ~`: whole radix-tree nodes only (cheaper, removes up to the bound).
    pub(crate) approximate: bool,
    /// Never past an entry a group still has pending or has not been delivered.
    pub(crate) safe: bool,
}

/// What `trim.lua` did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Trimmed {
    /// Entries removed.
    pub(crate) trimmed: u64,
    /// The MINID applied (`<ms>-<seq>`), empty when nothing was to be trimmed.
    pub(crate) applied_min_id: String,
    /// The safe mode stopped short of the bound for a group.
    pub(crate) held_back: bool,
    /// The groups whose undelivered entries were removed (only without the safe mode).
    pub(crate) unread: Vec<UnreadTrimmed>,
}

/// The archive's hold on a trim: the fold lease it must still hold, and where
/// the archive ends, which the bound never passes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fence<'a> {
    /// The fold lease key ([`crate::keys::Keyspace::fold_lease`]).
    pub(crate) lease: &'a str,
    /// The token this sidecar wrote there.
    pub(crate) token: &'a str,
    /// The manifest's `archived_through`; `None` while the archive holds
    /// nothing of the stream (then nothing is trimmed).
    pub(crate) through: Option<StreamId>,
}

/// Runs `trim.lua` on `stream`: the safe bound and XTRIM MINID in one script;
/// with `fence`, capped at what is archived and only while the lease holds;
/// with `dry`, the bound only (`applied_min_id`), nothing removed.
///
/// Errors: [`Error::WrongType`] when the key is not a stream;
/// [`Error::Aborted`] when the fold lease is no longer this sidecar's;
/// [`Error::Conflict`] without `fence` when the stream is archived (its
/// `<stream>:archive:through` exists); [`Error::Unavailable`] and
/// [`Error::Redis`] as Redis fails.
pub(crate) async fn run(
    redis: &Redis,
    stream: &str,
    trim: &Trim,
    fence: Option<Fence<'_>>,
    dry: bool,
) -> Result<Trimmed, Error> {
    let (keep, below) = match trim.bound {
        Bound::KeepNewest(n) => (n.to_string(), String::new()),
        Bound::Below(id) => (String::new(), id.to_string()),
    };
    let flag = |on: bool| if on { "1" } else { "0" };
    let mut conn = redis.conn.clone();
    let through_key = redis.keys.archive_through(stream);
    let through = fence.and_then(|f| f.through);
    let (trimmed, applied, held_back, unread): (u64, redis::Value, i64, redis::Value) = redis
        .scripts
        .trim
        .key(stream)
        .key(fence.map_or(stream, |f| f.lease))
        .key(&through_key)
        .arg(keep)
        .arg(below)
        .arg(flag(trim.approximate))
        .arg(flag(!trim.safe))
        .arg(fence.map_or("", |f| f.token))
        .arg(flag(dry))
        .arg(through.map_or_else(String::new, |id| id.to_string()))
        .invoke_async(&mut conn)
        .await
        .map_err(|e| match e.code() {
            Some("ECHOMQ_FENCED") => Error::Aborted {
                reason: format!("another sidecar took over folding stream `{stream}` into the archive; try again"),
            },
            Some("ECHOMQ_ARCHIVED") => Error::Conflict {
                reason: format!(
                    "stream `{stream}` is archived (`{through_key}` exists) and this sidecar has no --archive-url: \
                     it would trim entries it never archived; trim it through a sidecar with the stream's archive \
                     (or, giving the archive up on purpose, delete `{through_key}`)"
                ),
            },
            _ => Error::from_redis(e, "trimming (trim.lua)", stream),
        })?;
    let applied_min_id = bytes(&applied).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let unread = parse_unread_trimmed(&unread).map_err(|e| Error::from_redis(e, "reading trim.lua's reply", stream))?;
    Ok(Trimmed { trimmed, applied_min_id, held_back: held_back == 1, unread })
}
