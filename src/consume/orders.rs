//! The plain data the consume core and its Redis steps share: what the
//! [`ledger`](super::ledger) orders (acks, retry states, dead letters), what
//! the scripts answer (the outcome enums the job files return and the
//! ledger takes back) and the settings it applies (a group's policy, a
//! call's backoff). It sits below both: the job files and the ledger import
//! it, and it imports neither.

use std::time::Duration;

use crate::{id::StreamId, redis::RawEntry};

/// The most ids in one XACK (and one HDEL, and pairs in one HSET) of
/// `settle.lua`: Lua's `unpack` spreads them on its C stack, which holds
/// about 8,000.
pub(crate) const ACK_CHUNK: usize = 1024;

/// Identifies one Consume call inside the sidecar.
pub(crate) type SessionId = u64;

/// Settings of the whole group on this sidecar: every call on it must agree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GroupPolicy {
    /// Deliveries after which an entry is dead-lettered instead of handed out; 0: no limit.
    pub(crate) max_deliveries: u32,
    /// Where poison entries and Fails with `dead_letter` go.
    pub(crate) dead_letter_stream: String,
    /// Per-key limits (`Subscribe.key_field`), when set.
    pub(crate) keys: Option<KeyLimit>,
}

/// A group's per-key limit: at most `per_key` entries whose `field` holds
/// the same value are held at once in the whole group (see [`super::keyed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyLimit {
    /// The payload field whose value is an entry's key.
    pub(crate) field: String,
    /// The most entries of one key held at once (entries, at least 1).
    pub(crate) per_key: u32,
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
    /// Its member in the group's keyed entries (see [`super::keyed`]),
    /// removed with the XACK; `None` for an entry without a key.
    pub(crate) member: Option<Vec<u8>>,
}

/// Why a delivery failed (`Fail.kind`), which decides whether it counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FailKind {
    /// The entry failed: its next delivery is another attempt.
    Message,
    /// The handler could not try it: its next delivery keeps its count.
    Transient,
    /// It can never succeed: dead-lettered now.
    Poison,
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
    /// The failure counts as an attempt; false for a transient one, whose
    /// re-delivery keeps the delivery count (`XCLAIM … RETRYCOUNT`).
    pub(crate) counts: bool,
}

impl RetryWrite {
    /// The hash value, as `redeliver.lua` parses it: `"<due unix ms> <reason>"`,
    /// or `"<due unix ms>t <reason>"` for a failure that does not count.
    pub(crate) fn state(&self) -> String {
        let mark = if self.counts { "" } else { "t" };
        format!("{}{mark} {}", self.due_unix_ms, self.reason)
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

/// What [`dead_letter`](super::dead_letter::dead_letter) did with one entry.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum DeadLettered {
    /// No longer pending for this consumer (a peer took it): nothing done.
    NotOurs,
    /// Deleted from the stream while pending: dropped from the PEL.
    Deleted,
    /// Appended to the dead-letter stream as `dead_id` after `deliveries`
    /// deliveries, then acknowledged.
    Moved { dead_id: StreamId, deliveries: u64 },
}

/// What [`redeliver`](super::retry::redeliver) did with one due entry.
#[derive(Debug)]
pub(crate) enum Redelivery {
    /// No longer pending for this consumer (a peer took it): nothing done.
    NotOurs,
    /// Deleted from the stream while pending: dropped from the PEL.
    Deleted,
    /// Its retry delay (recorded by this sidecar before a restart, or by a
    /// peer) has not passed: not claimed.
    NotDue { due_unix_ms: u64 },
    /// It reached `max_deliveries`: not claimed, for the dead-letter step.
    Poison { deliveries: u64, reason: String },
    /// Claimed: `deliveries` is its delivery count now.
    Claimed { deliveries: u32, entry: RawEntry },
}

/// A delivery to give back to the group (a Release).
#[derive(Debug)]
pub(crate) struct ReleaseOrder {
    pub(crate) stream_id: StreamId,
    /// The Release that asked for it (call, id as sent), answered if it
    /// cannot be applied; `None` for an entry the sidecar gives back itself
    /// (read or waiting for its key, never handed out, when the group's
    /// last call left).
    pub(crate) answer: Option<(SessionId, String)>,
}

/// What [`release`](super::release::release) did with one entry.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// Given back: idle since long ago, its delivery count `deliveries` now
    /// (one less than the released delivery's).
    GivenBack { deliveries: u64 },
    /// No longer pending for this consumer (a peer took it): nothing done.
    NotOurs,
    /// Deleted from the stream while pending: dropped from the PEL.
    Deleted,
}

/// Why [`refresh`](super::lease::refresh) could not refresh a lease.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unrefreshed {
    /// Another consumer has it pending: a peer reclaimed it.
    ToPeer,
    /// Deleted from the stream: dropped from the PEL.
    Deleted,
    /// Pending for no consumer: acknowledged by another client (the call's
    /// verdict is then answered NOT_PENDING), or a re-created group has not
    /// read it again yet (and the verdict then applies).
    Unowned,
}

/// One entry an AckEmit appends, validated at the edge (stream allowed, on
/// the source's slot, fields within limits, none named like the reserved
/// field). The ledger carries it without looking inside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NewEmit {
    /// The stream key written.
    pub(crate) stream: String,
    /// The shard index and shard count it mints with (0 and 1 for a plain
    /// stream; see [`crate::keys::AppendTarget`]).
    pub(crate) shard: u32,
    pub(crate) shards: u32,
    /// Its fields, sorted by name (so an entry's field order does not depend
    /// on hashing).
    pub(crate) fields: Vec<(String, Vec<u8>)>,
}

/// A queued AckEmit: `ack_emit.lua` appends `emits` and acknowledges the
/// entry, only while it is pending for this consumer.
#[derive(Debug)]
pub(crate) struct EmitOrder {
    /// The call whose AckEmit it is, answered either way.
    pub(crate) session: SessionId,
    /// The id as the client sent it.
    pub(crate) text: String,
    pub(crate) stream_id: StreamId,
    pub(crate) emits: Vec<NewEmit>,
    /// Its delivery count and the call's retry delays: should Redis refuse
    /// the step (an emit stream of another type), the entry is retried as
    /// after a Fail.
    pub(crate) attempts: u32,
    pub(crate) backoff: Backoff,
    /// Its member in the group's keyed entries, removed with the XACK;
    /// `None` for an entry without a key.
    pub(crate) member: Option<Vec<u8>>,
}

/// What [`ack_emit`](super::ack_emit::ack_emit) did with one order.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Emission {
    /// Pending for no consumer (acknowledged already): nothing written.
    NotPending,
    /// Pending for another consumer (a peer reclaimed it): nothing written.
    NotOurs,
    /// The emits were appended with these stream ids, in order, and the
    /// entry acknowledged; `unconfirmed` says how the wait for replicas fell
    /// short (`--wait-replicas`, `--wait-aof`), if it did.
    Emitted { ids: Vec<StreamId>, unconfirmed: Option<String> },
}
