//! Recovery: of this consumer's own PEL at start (entries it was handed
//! before a crash or restart come back first, in stream order) and after a
//! read whose reply was lost (see [`Worker::recover_after_lost_read`]), and
//! of a group that vanished (NOGROUP: the stream was deleted, Redis flushed
//! or restarted without persistence).

use redis::{RedisResult, Value};

use tokio::{sync::watch, time::Instant};
use tracing::{debug, info};

use super::{
    worker::{Step, Worker},
    GroupKeys,
};
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
/// Errors: Redis' other than BUSYGROUP.
pub(crate) async fn recreate_group(keys: &GroupKeys) -> RedisResult<()> {
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
        Ok(()) => {
            tracing::info!(stream = %keys.stream, group = %keys.group, "group re-created from the start of the stream")
        }
        Err(e) if crate::redis::fault(&e) == crate::redis::Fault::BusyGroup => {
            tracing::info!(stream = %keys.stream, group = %keys.group, "group exists again")
        }
        Err(e) => return Err(e),
    }
    Ok(())
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

impl Worker {
    /// The primary switched: the new one may hold this consumer's PEL
    /// otherwise than the worker last saw it (an asynchronous replica had not
    /// yet received the last reads or acks), so the own PEL is walked again,
    /// as at start, and a pause for the old primary's errors ends now.
    pub(super) fn after_primary_switch(&mut self) {
        info!(stream = %self.keys.stream, group = %self.keys.group, "the Redis primary switched; recovering own pending entries from the new one");
        if !self.no_ack {
            self.recovering = Some(None);
        }
        self.paused_until = Instant::now();
        self.redis_ok();
    }

    pub(super) async fn recreate_group(&mut self) -> bool {
        if let Err(e) = recreate_group(&self.keys).await {
            self.redis_failed(Step::RecreateGroup, &e);
            return false;
        }
        self.redis_ok();
        self.metrics.group_recreations.inc();
        self.group_lost = false;
        self.reclaim_cursor = StreamId::ZERO;
        true
    }

    /// A `>` read was outstanding when its reply was lost: the reader was
    /// stopped under it (the group's last call left or drained), or its
    /// connection broke or timed out. Redis may have run it all the same and
    /// put its entries in this consumer's PEL, where nothing else would find
    /// them before the reclaim beat (after `--reclaim-min-idle-ms`) or a
    /// restart. So the own PEL is walked again, as at start, before the next
    /// new read: the next call gets those entries first. A read that took
    /// nothing costs one `XPENDING`; a worker whose reads all returned pays
    /// nothing. At most once (NOACK) nothing is pending: nothing to find.
    pub(super) fn recover_after_lost_read(&mut self) {
        if !self.no_ack && self.recovering.is_none() {
            debug!(stream = %self.keys.stream, group = %self.keys.group, "a read's reply was lost; recovering own pending entries before the next read");
            self.recovering = Some(None);
        }
    }

    /// Reads one page of this consumer's own PEL and queues the entries for
    /// re-delivery, in stream order.
    pub(super) async fn recover_page(&mut self, after: Option<StreamId>, count: usize) {
        let ids = match own_pending_page(&self.keys, after, count).await {
            Ok(ids) => ids,
            Err(e) => return self.redis_failed(Step::Recover, &e),
        };
        self.redis_ok();
        let now = Instant::now();
        for &id in &ids {
            if !self.ledger.tracks(id) {
                self.ledger.wait(id, now);
                self.recovered += 1;
            }
        }
        if ids.len() < count {
            let entries = std::mem::take(&mut self.recovered);
            if entries > 0 {
                info!(stream = %self.keys.stream, group = %self.keys.group, entries, "recovered own pending entries; reading new ones");
            } else {
                debug!(stream = %self.keys.stream, group = %self.keys.group, "no own pending entries to recover; reading new ones");
            }
            self.recovering = None;
        } else {
            self.recovering = Some(ids.last().copied().or(after));
        }
    }
}
