//! Release: deliveries a client never started go back to the group at once,
//! their delivery count restored, for this sidecar's other calls or a peer.
//!
//! `release.lua` leaves each entry in this consumer's PEL with one delivery
//! less (`XCLAIM … RETRYCOUNT <count - 1>`) and an idle time of
//! [`RELEASED_IDLE`] (`XCLAIM … IDLE`), both with `JUSTID` (the claim counts
//! no delivery). Then:
//! - a peer's next reclaim beat (XAUTOCLAIM … JUSTID, which counts none either)
//!   takes it whatever its `--reclaim-min-idle-ms`;
//! - this sidecar's ledger queues it as due now, so its other calls of the
//!   group get it first when they have room; it is not leased (only held and
//!   ready entries are), so its idle time stays until someone claims it;
//! - whoever claims it for delivery (`redeliver.lua`'s XCLAIM) raises the
//!   count back to what the released delivery said, and only if it is still
//!   theirs: a peer that took it is never doubled by this sidecar.
//!
//! It uses only XPENDING, XRANGE, XCLAIM (IDLE, RETRYCOUNT, JUSTID), XACK and
//! HDEL, which every supported server has. `XNACK … SILENT` (Redis 8.8) is not
//! used: it cannot be tested on the servers supported.

use std::time::Duration;

use redis::{RedisResult, Value};

use super::{orders::Released, GroupKeys};
use crate::{
    id::StreamId,
    redis::{array, int, tagged, unknown_tag},
};

/// The PEL idle time a released entry gets: 365 days, far above any
/// `--reclaim-min-idle-ms` a peer runs with (so its next reclaim beat takes
/// the entry), far below the unix time (XCLAIM would take an idle time
/// reaching before the epoch as 0).
pub(crate) const RELEASED_IDLE: Duration = Duration::from_secs(365 * 24 * 3600);

/// Gives `ids` back to the group (`release.lua`: XPENDING … consumer,
/// XRANGE, then XCLAIM … IDLE … RETRYCOUNT … JUSTID, or XACK and HDEL of a
/// deleted one), one reply per id in order.
///
/// Errors: Redis' (NOGROUP when the group is gone), or a reply not shaped as
/// the script's (a Parse error).
pub(crate) async fn release(keys: &GroupKeys, ids: &[StreamId]) -> RedisResult<Vec<(StreamId, Released)>> {
    let mut script = keys.redis.scripts.release.prepare_invoke();
    script
        .key(&keys.stream)
        .key(&keys.retries)
        .arg(&keys.group)
        .arg(&keys.consumer)
        .arg(RELEASED_IDLE.as_millis() as u64);
    for id in ids {
        script.arg(id.to_string());
    }
    let mut conn = keys.redis.conn.clone();
    let reply: Value = script.invoke_async(&mut conn).await?;
    array(&reply).iter().map(parse_released).collect()
}

fn parse_released(item: &Value) -> RedisResult<(StreamId, Released)> {
    let (id, tag, rest) = tagged(item)?;
    let outcome = match tag.as_str() {
        "released" => Released::GivenBack { deliveries: int(rest.first().unwrap_or(&Value::Nil))?.max(0) as u64 },
        "not_ours" => Released::NotOurs,
        "deleted" => Released::Deleted,
        other => return Err(unknown_tag("release.lua", other)),
    };
    Ok((id, outcome))
}

#[cfg(test)]
mod tests {
    use super::super::script_replies::bulk;
    use super::*;

    #[test]
    fn every_reply_of_the_script_parses_into_its_outcome() {
        let items = [
            Value::Array(vec![bulk("1-0"), bulk("released"), Value::Int(2)]),
            Value::Array(vec![bulk("2-0"), bulk("not_ours")]),
            Value::Array(vec![bulk("3-0"), bulk("deleted")]),
        ];
        let parsed: Vec<_> = items.iter().map(|item| parse_released(item).unwrap()).collect();
        assert_eq!(parsed[0], (StreamId { ms: 1, seq: 0 }, Released::GivenBack { deliveries: 2 }));
        assert_eq!(parsed[1].1, Released::NotOurs);
        assert_eq!(parsed[2].1, Released::Deleted);
        assert!(parse_released(&Value::Array(vec![bulk("1-0"), bulk("what")])).is_err());
    }

    #[test]
    fn the_script_replies_exactly_the_tags_known_here() {
        let known = ["released", "not_ours", "deleted"];
        let lua = include_str!("release.lua");
        super::super::script_replies::assert_replies_agree("release.lua", lua, &known, parse_released);
    }

    #[test]
    fn the_released_idle_time_is_above_any_min_idle_and_after_the_epoch() {
        // 365 days: a year before now is long after 1970.
        assert!(RELEASED_IDLE.as_millis() < u128::from(crate::entry::now_unix_ms()));
        assert!(RELEASED_IDLE > Duration::from_secs(30 * 24 * 3600));
    }
}
