//! What a call and its group's worker tell each other: [`Command`]s from the
//! call's session to the worker (one bounded channel per worker, shared by
//! its calls), [`Event`]s back (one unbounded channel per call).

use std::time::Duration;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use super::{
    ledger::{FailVerdict, Policy},
    orders::{GroupPolicy, NewEmit, SessionId},
};
use crate::{
    error::Error,
    id::BrandedId,
    proto::{Emitted, VerdictError},
    wire::OutgoingDelivery,
};

/// What the worker tells a call. The channel is unbounded, but what flows on it
/// is bounded: deliveries by the call's credit, verdict errors by the verdicts
/// the call sent (and a call does not read new verdicts while its answers
/// pile up).
///
/// The messages are boxed: tokio's channel allocates room for 32 events when
/// it is made, which with a `Delivery` inline (248 bytes an event) cost every
/// call 8 KB, idle or not.
#[derive(Debug)]
pub(crate) enum Event {
    /// Hand this to the client: the delivery of `id` from the call's shard `shard`.
    Delivery { shard: usize, id: BrandedId, delivery: Box<OutgoingDelivery> },
    /// The answer to a verdict that was not applied, or an unasked LEASE_LOST.
    VerdictError(Box<VerdictError>),
    /// The answer to an AckEmit that was applied.
    Emitted(Box<Emitted>),
    /// The call no longer holds `id` from shard `shard` (its ack deadline
    /// passed, a peer took it, it was deleted): a sharded call's relay routes
    /// its later verdict here still, and may hand over a namesake it parked.
    /// `settled`: by the call's own verdict (no later verdict needs the route).
    Left { shard: usize, id: BrandedId, settled: bool },
}

/// Room for `n` ids among the ids a call has in flight to its workers, taken
/// by the call's relay and given back once the worker has handled them and
/// handed out their answers: one Ack can name 100,000 ids, each of which may
/// be answered, and a client that does not read must not grow those answers
/// without bound (see `session::IDS_IN_FLIGHT`).
pub(crate) type InFlight = OwnedSemaphorePermit;

/// What a call tells its worker.
///
/// The variants larger than two words are boxed: tokio's channel allocates
/// room for 32 commands when it is made, and with them inline (152 bytes a
/// command) each group's channel took 4.9 KB, idle or not; 1.3 KB with an
/// Ack's ids inline (40 bytes), 0.8 KB now (24). An Ack's box is one small
/// allocation beside its ids'.
#[derive(Debug)]
pub(crate) enum Command {
    /// A new call subscribed.
    Attach(Box<Attach>),
    /// Acknowledge these deliveries.
    Ack(Box<Verdicts>),
    /// A delivery failed.
    Fail { session: SessionId, fail: Box<FailVerdict> },
    /// Give these deliveries back to the group: the client never started them.
    Release(Box<Verdicts>),
    /// Acknowledge delivery `id` (`text` as the client sent it) and append
    /// `emits` (validated), in one step fenced on the entry (see
    /// [`super::ack_emit`]).
    AckEmit { session: SessionId, ack_emit: Box<AckEmit> },
    /// Push the ack deadline of these deliveries to now + `by`.
    Extend { session: SessionId, extend: Box<Extend> },
    /// The client is stopping: hand this call nothing more.
    Drain { session: SessionId },
    /// The call ended; what it holds goes back to waiting.
    /// `flushed` is answered once the call's verdicts have reached Redis, so
    /// a call that ends OK has had its acks applied.
    Detach { session: SessionId, flushed: oneshot::Sender<()> },
    /// The batched reclaim probe found entries to reclaim in the group (or
    /// could not tell): run the reclaim beat now (see [`super::reclaim_probe`]).
    Reclaim,
}

/// A new call subscribed; deliveries and verdict errors go to `events`,
/// deliveries marked with `shard` (the index of this worker's stream among
/// the call's shards; 0 for a plain stream). Answered with an error when
/// `group` conflicts with the group's calls.
/// An AckEmit verdict: acknowledge delivery `id` (`text` as the client sent
/// it) and append `emits`.
#[derive(Debug)]
pub(crate) struct AckEmit {
    pub(crate) text: String,
    pub(crate) id: BrandedId,
    pub(crate) emits: Vec<NewEmit>,
}

/// The ids of an Ack or a Release (the client's text and the parsed id).
#[derive(Debug)]
pub(crate) struct Verdicts {
    /// The call that sent them.
    pub(crate) session: SessionId,
    /// At most `session::IDS_PER_PIECE` (1,024) of the message's ids.
    pub(crate) ids: Vec<(String, BrandedId)>,
    /// Their room among the call's ids in flight, given back once handled.
    pub(crate) in_flight: InFlight,
}

/// An Extend: push the ack deadline of `ids` to now + `by`.
#[derive(Debug)]
pub(crate) struct Extend {
    pub(crate) ids: Vec<(String, BrandedId)>,
    pub(crate) by: Duration,
    /// Their room among the call's ids in flight, given back once handled.
    pub(crate) in_flight: InFlight,
}

#[derive(Debug)]
pub(crate) struct Attach {
    pub(crate) session: SessionId,
    pub(crate) shard: usize,
    pub(crate) policy: Policy,
    pub(crate) group: GroupPolicy,
    pub(crate) events: mpsc::UnboundedSender<Event>,
    pub(crate) reply: oneshot::Sender<Result<(), Error>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_takes_three_words() {
        // Each group's channel has room for 32 of them, idle or not.
        assert_eq!(std::mem::size_of::<Command>(), 24);
    }
}
