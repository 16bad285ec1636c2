//! Trim: validate exactly one bound → `trim.lua` (safe bound and XTRIM MINID,
//! atomically) → what was removed.

use super::{
    fold::{Asked, Folding},
    Streams,
};
use crate::{
    error::Error,
    id::StreamId,
    proto::{TrimRequest, TrimResponse},
    redis::{
        trim::{run, Bound, Trim, Trimmed},
        Redis,
    },
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
/// Errors: as [`crate::redis::trim::run`] and [`Folding::fold_then_trim`].
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
