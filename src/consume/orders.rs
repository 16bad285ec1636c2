//! The plain data the consume core and its Redis steps share: what the
//! [`ledger`](super::ledger) orders (acks, retry states, dead letters) and
//! the settings it applies (a group's policy, a call's backoff). It sits
//! below both: the job files that carry the orders out and the ledger that
//! queues them import it, and it imports neither.

use std::time::Duration;

use crate::id::StreamId;

/// Identifies one Consume call inside the sidecar.
pub(crate) type SessionId = u64;

/// Settings of the whole group on this sidecar: every call on it must agree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GroupPolicy {
    /// Deliveries after which an entry is dead-lettered instead of handed out; 0: no limit.
    pub(crate) max_deliveries: u32,
    /// Where poison entries and Fails with `dead_letter` go.
    pub(crate) dead_letter_stream: String,
}

/// The retry delays of a subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// The first retry delay; doubled per delivery.
    pub(crate) initial: Duration,
    /// The cap of the retry delay.
    pub(crate) max: Duration,
}

impl Backoff {
    /// The retry delay after `attempts` deliveries: `initial × 2^(attempts-1)`,
    /// capped, then jittered into its upper half so that entries failed
    /// together do not come back together.
    pub(crate) fn delay(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(30);
        let full = self.initial.saturating_mul(1 << doublings).min(self.max);
        let half = full / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

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

/// A retry state to record in the group's retry hash.
#[derive(Debug)]
pub(crate) struct RetryWrite {
    pub(crate) stream_id: StreamId,
    /// When the entry is due again (unix milliseconds).
    pub(crate) due_unix_ms: u64,
    /// Its last failure reason, dead letters' `echomq.reason` should it be
    /// dead-lettered after `max_deliveries`.
    pub(crate) reason: String,
}

impl RetryWrite {
    /// The hash value: `"<due unix ms> <reason>"`, as `redeliver.lua` parses it.
    pub(crate) fn state(&self) -> String {
        format!("{} {}", self.due_unix_ms, self.reason)
    }
}

/// An entry to dead-letter.
#[derive(Debug)]
pub(crate) struct DeadLetterOrder {
    pub(crate) stream_id: StreamId,
    /// Its `echomq.reason`.
    pub(crate) reason: String,
    /// The Fail that asked for it (call, id as sent), answered if it cannot be applied.
    pub(crate) verdict: Option<(SessionId, String)>,
}
