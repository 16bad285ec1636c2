//! The reclaim beat, batched across a sidecar's groups on a single server (or
//! Sentinel). Each group's worker would otherwise send an `XAUTOCLAIM` every
//! `--reclaim-interval-ms`, found empty nearly always: 0.2 round trips per
//! second per subscription, the largest part of an idle sidecar's upkeep. One
//! task instead runs `reclaim_probe.lua` over the groups, [`PROBE_CHUNK`] per
//! run, and tells only the workers whose group has an entry idle past
//! `--reclaim-min-idle-ms` (or whose probe failed) to reclaim now
//! ([`Command::Reclaim`]); their reclaim is the one they always ran, with
//! its `XAUTOCLAIM`, its cursor and its NOGROUP recovery.
//!
//! On a Redis Cluster a script's keys must share a slot, so there each worker
//! keeps its own beat ([`batched`] is false).

use std::{
    sync::{Mutex, Weak},
    time::Duration,
};

use redis::RedisResult;
use tokio::time::{interval, MissedTickBehavior};

use super::{commands::Command, Shared, WorkerMap};
use crate::redis::Redis;

/// The most groups one probe run covers: a run is one `XPENDING … IDLE` per
/// group, about a microsecond each, so Redis is never held long.
pub(crate) const PROBE_CHUNK: usize = 500;

/// Whether reclaims are probed in batches here: on a single server or
/// Sentinel, not on a cluster.
pub(crate) fn batched(redis: &Redis) -> bool {
    redis.primary().is_some()
}

/// Probes every `--reclaim-interval-ms` while Redis is up; ends with the
/// consumer side (when `shared` or `workers` is gone).
pub(crate) async fn run(shared: Weak<Shared>, workers: Weak<Mutex<WorkerMap>>, every: Duration) {
    let mut beat = interval(every);
    beat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        beat.tick().await;
        let (Some(shared), Some(workers)) = (shared.upgrade(), workers.upgrade()) else { return };
        if !*shared.redis_up.borrow() || *shared.draining.borrow() {
            continue;
        }
        // At most once (NOACK) nothing is pending: nothing to reclaim.
        let groups: Vec<_> = workers
            .lock()
            .expect("workers lock")
            .iter()
            .filter(|((_, _, no_ack), _)| !no_ack)
            .filter_map(|((stream, group, _), worker)| Some((stream.clone(), group.clone(), worker.upgrade()?)))
            .collect();
        for chunk in groups.chunks(PROBE_CHUNK) {
            let due =
                match probe(&shared, chunk.iter().map(|(stream, group, _)| (stream.as_str(), group.as_str()))).await {
                    Ok(due) => due,
                    Err(e) => {
                        tracing::debug!(
                            "the reclaim probe failed ({e}); every group it covers reclaims on its own this beat"
                        );
                        (0..chunk.len()).collect()
                    }
                };
            for n in due {
                // A worker too busy to take it now is probed again next beat.
                let _ = chunk[n].2.try_send(Command::Reclaim);
            }
        }
    }
}

/// The positions (0-based) among `groups` of those to reclaim now (see
/// `reclaim_probe.lua`).
///
/// Errors: Redis', for the whole run.
async fn probe<'a>(shared: &Shared, groups: impl Iterator<Item = (&'a str, &'a str)>) -> RedisResult<Vec<usize>> {
    let mut script = shared.redis.scripts.reclaim_probe.prepare_invoke();
    script.arg(shared.reclaim_min_idle.as_millis() as u64);
    for (stream, group) in groups {
        script.key(stream).arg(group);
    }
    let mut conn = shared.redis.conn.clone();
    let due: Vec<usize> = script.invoke_async(&mut conn).await?;
    Ok(due.into_iter().filter_map(|n| n.checked_sub(1)).collect())
}
