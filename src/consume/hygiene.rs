//! Consumer hygiene (`hygiene.lua`): every beat records this sidecar's
//! heartbeat in the group's heartbeat hash, and removes the group's consumers
//! that have been idle past `--consumer-idle-limit-ms`, hold nothing and have
//! no fresh heartbeat, so XINFO stays readable as pods come and go. Never one
//! with pending entries (XGROUP DELCONSUMER would drop its PEL), never this
//! sidecar's own, and never a live sidecar's: Redis 7.0 leaves the idle time
//! of a consumer blocked on a quiet stream growing, so only the heartbeat
//! tells a live sidecar from a dead one.
//!
//! The worker of a group outlives its last call, so its beat may find the
//! stream deleted (DEL, FLUSHALL, a Redis restart without persistence). It
//! says so once, in words, records nothing while the stream is gone, and
//! says so again when the stream is back.

use std::time::Duration;

use redis::RedisResult;

use super::GroupKeys;

/// The longest time between two heartbeats of a sidecar.
const MAX_BEAT: Duration = Duration::from_secs(10);

/// How often a worker beats: a quarter of its idle limit (so a peer with the
/// same limit sees at least three beats within it), at most [`MAX_BEAT`], at
/// least 100 ms; every [`MAX_BEAT`] without a limit (the heartbeat still
/// keeps peers that clean from removing this sidecar).
pub(crate) fn beat_interval(idle_limit: Option<Duration>) -> Duration {
    idle_limit.map_or(MAX_BEAT, |limit| (limit / 4).clamp(Duration::from_millis(100), MAX_BEAT))
}

/// What one hygiene beat (`hygiene.lua`) found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Beat {
    /// The heartbeat is recorded; these dead consumers were removed (often none).
    Done {
        /// The consumers removed, by name.
        removed: Vec<String>,
    },
    /// The stream does not exist: nothing was recorded or removed.
    StreamGone,
}

/// Records this sidecar's heartbeat and, with `idle_limit`, removes the dead
/// consumers (`EVALSHA hygiene.lua`, one atomic run).
///
/// Errors: Redis' (NOGROUP when the stream exists without the group and a
/// limit is set).
pub(crate) async fn beat(keys: &GroupKeys, idle_limit: Option<Duration>) -> RedisResult<Beat> {
    let mut conn = keys.redis.conn.clone();
    let removed: Option<Vec<String>> = keys
        .redis
        .scripts
        .hygiene
        .key(&keys.stream)
        .key(&keys.heartbeats)
        .arg(&keys.group)
        .arg(&keys.consumer)
        .arg(idle_limit.map_or(0, |limit| limit.as_millis().max(1) as u64))
        .invoke_async(&mut conn)
        .await?;
    Ok(removed.map_or(Beat::StreamGone, |removed| Beat::Done { removed }))
}
