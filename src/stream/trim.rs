//! Trim: validate exactly one bound → `trim.lua` (safe bound and XTRIM MINID,
//! atomically) → what was removed.

use super::Streams;
use crate::{
    error::Error,
    id::StreamId,
    proto::{TrimRequest, TrimResponse},
    redis::bytes,
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
    let (mode, value) = if request.max_len > 0 {
        ("maxlen", request.max_len.to_string())
    } else if let Some(before) = request.before {
        let ms = crate::entry::unix_ms_of("before", before)?;
        ("minid", StreamId { ms, seq: 0 }.to_string())
    } else {
        ("minid", request.min_id.parse::<StreamId>().map_err(|e| Error::invalid("min_id", e.to_string()))?.to_string())
    };
    let mut conn = streams.redis.conn.clone();
    let reply: (u64, redis::Value, i64) = streams
        .redis
        .scripts
        .trim
        .key(stream)
        .arg(mode)
        .arg(value)
        .arg(if request.approximate { "1" } else { "0" })
        .arg(if request.ignore_groups { "1" } else { "0" })
        .invoke_async(&mut conn)
        .await
        .map_err(|e| Error::from_redis(e, "trimming (trim.lua)", stream))?;
    let (trimmed, applied, held_back) = reply;
    let applied_min_id = bytes(&applied).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    if held_back == 1 {
        tracing::info!(%stream, %applied_min_id, "trim held back to keep entries that groups still need");
    }
    Ok(TrimResponse { trimmed, applied_min_id, held_back_by_groups: held_back == 1 })
}
