//! Consumer hygiene: removes the group's consumers that have been idle past
//! `--consumer-idle-limit-ms` and hold nothing (`forget_consumers.lua`), so
//! XINFO stays readable as pods come and go; never one with pending entries
//! (XGROUP DELCONSUMER would drop its PEL), and never this sidecar's own.

use std::time::Duration;

use redis::RedisResult;

use tracing::info;

use super::{
    worker::{Step, Worker},
    GroupKeys,
};

/// Removes the dead consumers; returns their names.
///
/// Errors: Redis' (NOGROUP when the group is gone).
pub(crate) async fn forget_dead_consumers(keys: &GroupKeys, idle_limit: Duration) -> RedisResult<Vec<String>> {
    let mut conn = keys.redis.conn.clone();
    keys.redis
        .scripts
        .forget_consumers
        .key(&keys.stream)
        .arg(&keys.group)
        .arg(&keys.consumer)
        .arg(idle_limit.as_millis() as u64)
        .invoke_async(&mut conn)
        .await
}

impl Worker {
    /// The consumer hygiene beat (see [`hygiene`]).
    pub(super) async fn forget_dead_consumers(&mut self) {
        let Some(limit) = self.shared.consumer_idle_limit else { return };
        if !self.redis_usable() {
            return;
        }
        match forget_dead_consumers(&self.keys, limit).await {
            Ok(removed) if !removed.is_empty() => {
                info!(stream = %self.keys.stream, group = %self.keys.group, ?removed, "removed idle consumers that held nothing")
            }
            Ok(_) => {}
            Err(e) => self.redis_failed(Step::ForgetConsumers, &e),
        }
    }
}
