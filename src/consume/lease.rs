//! Leases: who handles an entry is who has it in their PEL.
//!
//! - **Lease refresh** ([`refresh`], `refresh.lua`): while a call holds an
//!   entry, the worker resets its PEL idle time every `--lease-refresh-ms`
//!   (XCLAIM … JUSTID, which counts no delivery), so a live, slow handler is
//!   not robbed by a peer's reclaim; it learns which entries a peer took
//!   anyway (the call is told LEASE_LOST) or were deleted.
//! - **Reclaim** ([`reclaim`]): every `--reclaim-interval-ms` the worker takes
//!   over entries idle longer than `--reclaim-min-idle-ms` in any consumer's
//!   PEL (XAUTOCLAIM … JUSTID), no more than its calls have credit for,
//!   following XAUTOCLAIM's cursor; they then wait for re-delivery, which
//!   claims them with a delivery counted.

use std::time::Duration;

use redis::{RedisResult, Value};

use super::{orders::Unrefreshed, GroupKeys};
use crate::{
    id::StreamId,
    redis::{array, parse_stream_id, tagged, unknown_tag},
};

/// Refreshes the leases of `ids`; returns those it could not refresh, and why.
///
/// Errors: Redis' (NOGROUP when the group is gone), or a reply not shaped as
/// the script's.
pub(crate) async fn refresh(keys: &GroupKeys, ids: &[StreamId]) -> RedisResult<Vec<(StreamId, Unrefreshed)>> {
    let mut script = keys.redis.scripts.refresh.prepare_invoke();
    // Unknown server: look, which costs an XRANGE per id but is never wrong.
    let look = keys.redis.server.is_none_or(|server| !server.claims_drop_deleted());
    script.key(&keys.stream).key(&keys.retries).arg(&keys.group).arg(&keys.consumer).arg(if look { "1" } else { "0" });
    for id in ids {
        script.arg(id.to_string());
    }
    let mut conn = keys.redis.conn.clone();
    let reply: Value = script.invoke_async(&mut conn).await?;
    array(&reply).iter().map(parse_unrefreshed).collect()
}

fn parse_unrefreshed(item: &Value) -> RedisResult<(StreamId, Unrefreshed)> {
    let (id, tag, _) = tagged(item)?;
    let why = match tag.as_str() {
        "to_peer" => Unrefreshed::ToPeer,
        "deleted" => Unrefreshed::Deleted,
        "unowned" => Unrefreshed::Unowned,
        other => return Err(unknown_tag("refresh.lua", other)),
    };
    Ok((id, why))
}

/// One XAUTOCLAIM page.
#[derive(Debug)]
pub(crate) struct Reclaimed {
    /// The cursor for the next page; `0-0` once the PEL was walked through.
    pub(crate) next: StreamId,
    /// Entries now this consumer's.
    pub(crate) claimed: Vec<StreamId>,
    /// Entries deleted from the stream, which XAUTOCLAIM dropped from the PEL.
    pub(crate) deleted: Vec<StreamId>,
}

/// Takes over at most `count` entries idle longer than `min_idle`, from
/// `cursor` on (`XAUTOCLAIM <stream> <group> <consumer> <min_idle ms>
/// <cursor> COUNT <count> JUSTID`).
///
/// Errors: Redis' (NOGROUP when the group is gone).
pub(crate) async fn reclaim(
    keys: &GroupKeys,
    min_idle: Duration,
    cursor: StreamId,
    count: usize,
) -> RedisResult<Reclaimed> {
    let mut conn = keys.redis.conn.clone();
    let reply: Value = redis::cmd("XAUTOCLAIM")
        .arg(&keys.stream)
        .arg(&keys.group)
        .arg(&keys.consumer)
        .arg(min_idle.as_millis() as u64)
        .arg(cursor.to_string())
        .arg("COUNT")
        .arg(count)
        .arg("JUSTID")
        .query_async(&mut conn)
        .await?;
    let parts = array(&reply);
    let ids = |n: usize| -> RedisResult<Vec<StreamId>> {
        parts.get(n).map(array).unwrap_or_default().iter().map(parse_stream_id).collect()
    };
    Ok(Reclaimed { next: parse_stream_id(parts.first().unwrap_or(&Value::Nil))?, claimed: ids(1)?, deleted: ids(2)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refresh_script_replies_exactly_the_tags_known_here() {
        let known = ["to_peer", "deleted", "unowned"];
        let lua = include_str!("refresh.lua");
        super::super::script_replies::assert_replies_agree("refresh.lua", lua, &known, parse_unrefreshed);
    }
}
