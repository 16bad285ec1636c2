//! Recovery: of this consumer's own PEL at start (entries it was handed
//! before a crash or restart come back first, in stream order) and after a
//! read whose reply was lost (see the worker's `recover_after_lost_read`), and
//! of a group that vanished (NOGROUP: the stream was deleted, Redis flushed
//! or restarted without persistence).

use redis::{RedisResult, Value};

use tokio::sync::watch;

use super::GroupKeys;
use crate::{
    id::StreamId,
    redis::{array, parse_stream_id, primary::PrimaryState},
};

/// One page of this consumer's own PEL after `after` (`None`: from the
/// start), at most `count` ids (`XPENDING <stream> <group> (<after> + <count>
/// <consumer>`). Fewer than `count` means the PEL was walked through.
///
/// Errors: Redis' (NOGROUP when the group is gone).
pub(crate) async fn own_pending_page(
    keys: &GroupKeys,
    after: Option<StreamId>,
    count: usize,
) -> RedisResult<Vec<StreamId>> {
    let start = after.map_or_else(|| "-".to_owned(), |id| format!("({id}"));
    let mut conn = keys.redis.conn.clone();
    let reply: Value = redis::cmd("XPENDING")
        .arg(&keys.stream)
        .arg(&keys.group)
        .arg(start)
        .arg("+")
        .arg(count)
        .arg(&keys.consumer)
        .query_async(&mut conn)
        .await?;
    array(&reply).iter().map(|item| parse_stream_id(array(item).first().unwrap_or(&Value::Nil))).collect()
}

/// Re-creates a lost group from the start of what the stream holds now
/// (`XGROUP CREATE <stream> <group> 0 MKSTREAM`; BUSYGROUP: it exists again).
/// From `0`, not `$`: after a flush or a restart without persistence
/// everything in the stream arrived after the group was lost, and skipping
/// it would lose entries; re-delivering is the at-least-once side.
///
/// Returns whether it created the group (false: BUSYGROUP, it exists again).
///
/// Errors: Redis' other than BUSYGROUP.
pub(crate) async fn recreate_group(keys: &GroupKeys) -> RedisResult<bool> {
    let mut conn = keys.redis.conn.clone();
    let created: RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&keys.stream)
        .arg(&keys.group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut conn)
        .await;
    match created {
        Ok(()) => Ok(true),
        Err(e) if crate::redis::fault(&e) == crate::redis::Fault::BusyGroup => Ok(false),
        Err(e) => Err(e),
    }
}

/// Resolves when a switch of primary has ended (a new primary found, see
/// [`crate::redis::primary`]); never on a cluster, which has no one primary
/// to follow (`switches` is `None`).
pub(crate) async fn primary_switched(switches: &mut Option<watch::Receiver<PrimaryState>>) {
    if let Some(switches) = switches {
        while switches.changed().await.is_ok() {
            if switches.borrow_and_update().switching.is_none() {
                return;
            }
        }
    }
    std::future::pending().await
}
