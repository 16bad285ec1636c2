//! Acknowledging in batches: the acks and retry states queued by one batch of
//! commands reach Redis as one `settle.lua` run (one request for Redis to
//! parse and dispatch, not a pipeline of many).

use redis::RedisResult;

use super::{retry::RetryWrite, GroupKeys, SessionId};
use crate::id::StreamId;

/// A queued XACK.
#[derive(Debug)]
pub(crate) struct PendingAck {
    /// The call whose Ack it is, answered if XACK finds nothing pending.
    pub(crate) session: SessionId,
    /// The id as the client sent it.
    pub(crate) text: String,
    pub(crate) stream_id: StreamId,
    /// The entry was delivered before, so the group's retry hash may hold it.
    pub(crate) redelivered: bool,
}

/// Records `writes` in the retry hash, then XACKs each of `acks` (one by one,
/// so the reply says which were still pending) and drops the retry state of
/// the re-delivered ones. Returns, per ack in order, whether it was pending.
///
/// Errors: Redis' (a timeout leaves the outcome unknown).
pub(crate) async fn settle(keys: &GroupKeys, acks: &[PendingAck], writes: &[RetryWrite]) -> RedisResult<Vec<bool>> {
    let mut script = keys.redis.scripts.settle.prepare_invoke();
    script.key(&keys.stream).key(&keys.retries).arg(&keys.group).arg(acks.len());
    for ack in acks {
        script.arg(ack.stream_id.to_string());
    }
    script.arg(acks.iter().filter(|a| a.redelivered).count());
    for ack in acks.iter().filter(|a| a.redelivered) {
        script.arg(ack.stream_id.to_string());
    }
    script.arg(writes.len());
    for write in writes {
        script.arg(write.stream_id.to_string()).arg(write.state());
    }
    let mut conn = keys.redis.conn.clone();
    let counts: Vec<i64> = script.invoke_async(&mut conn).await?;
    Ok(counts.into_iter().map(|count| count == 1).collect())
}
