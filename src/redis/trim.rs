//! `trim.lua`'s wrapper: a typed bound in, what the script did out. The one
//! way a stream is trimmed, by the Trim call, retention and the archive's
//! fold alike ([`crate::stream::fold`] calls it with a `Fence`).

use super::{
    connect::Redis,
    reply::{bytes, parse_unread_trimmed, UnreadTrimmed},
};
use crate::{error::Error, id::StreamId};

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
