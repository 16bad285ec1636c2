//! Consumer hygiene (`hygiene.lua`): every beat records this sidecar's
//! heartbeat in the group's heartbeat hash, and removes the group's consumers
//! that have been idle past `--consumer-idle-limit-ms`, hold nothing and have
//! no fresh heartbeat, so XINFO stays readable as pods come and go. Never one
//! with pending entries (XGROUP DELCONSUMER would drop its PEL), never this
//! sidecar's own, and never a live sidecar's: Redis 7.0 leaves the idle time
//! of a consumer blocked on a quiet stream growing, so only the heartbeat
//! tells a live sidecar from a dead one.

use std::time::Duration;

use redis::RedisResult;

use tracing::info;

use super::{
    worker::{Step, Worker},
    GroupKeys,
};

/// The longest time between two heartbeats of a sidecar.
const MAX_BEAT: Duration = Duration::from_secs(10);

/// How often a worker beats: a quarter of its idle limit (so a peer with the
/// same limit sees at least three beats within it), at most [`MAX_BEAT`], at
/// least 100 ms; every [`MAX_BEAT`] without a limit (the heartbeat still
/// keeps peers that clean from removing this sidecar).
pub(crate) fn beat_interval(idle_limit: Option<Duration>) -> Duration {
    idle_limit.map_or(MAX_BEAT, |limit| (limit / 4).clamp(Duration::from_millis(100), MAX_BEAT))
}

/// Records this sidecar's heartbeat and, with `idle_limit`, removes the dead
/// consumers; returns their names.
///
/// Errors: Redis' (NOGROUP when the group is gone and a limit is set).
pub(crate) async fn beat(keys: &GroupKeys, idle_limit: Option<Duration>) -> RedisResult<Vec<String>> {
    let mut conn = keys.redis.conn.clone();
    keys.redis
        .scripts
        .hygiene
        .key(&keys.stream)
        .key(&keys.heartbeats)
        .arg(&keys.group)
        .arg(&keys.consumer)
        .arg(idle_limit.map_or(0, |limit| limit.as_millis().max(1) as u64))
        .invoke_async(&mut conn)
        .await
}

impl Worker {
    /// The hygiene beat (see [`hygiene`](self)).
    pub(super) async fn hygiene(&mut self) {
        if !self.redis_usable() {
            return;
        }
        match beat(&self.keys, self.shared.consumer_idle_limit).await {
            Ok(removed) if !removed.is_empty() => {
                info!(stream = %self.keys.stream, group = %self.keys.group, ?removed, "removed dead consumers that held nothing")
            }
            Ok(_) => {}
            Err(e) => self.redis_failed(Step::Hygiene, &e),
        }
    }
}
