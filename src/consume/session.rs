//! One Consume call after its subscribe: relays the client's verdicts to the
//! group worker and the worker's deliveries and verdict errors to the client.
//!
//! A call on a sharded stream is served by one worker per shard: the relay
//! remembers which shard each delivery it holds came from and sends each
//! verdict there.
//!
//! Malformed verdicts are answered here, without a trip to the worker, and so
//! are verdicts on deliveries the worker let go of because Redis no longer
//! has them pending for this sidecar (lost to a peer, deleted). While
//! the client does not read, the relay waits on the outbound channel and reads
//! no new verdicts either, nor while the worker's answers pile up (one Ack can
//! name thousands of ids), so gRPC flow control pushes back on the client and
//! nothing grows without bound.

use std::{collections::HashMap, time::Duration};

use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Status, Streaming};
use tracing::debug;

use super::worker::{Command, Event, FailVerdict, Gone, SessionId, UNKNOWN_ID};
use crate::{
    error::Error,
    id::BrandedId,
    proto::{
        consume_request::Kind, consume_response, ConsumeRequest, ConsumeResponse, Delivery, VerdictError,
        VerdictErrorCode,
    },
};

/// How long an ending call waits for its last verdicts to reach Redis.
const DETACH_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// A Fail reason is cut to this many bytes.
const MAX_REASON_BYTES: usize = 4096;
/// Deliveries lost to a peer or to deletion whose verdict may still come, at
/// most; past it they are forgotten, and a late verdict is UNKNOWN_ID.
const GONE_REMEMBERED: usize = 4096;
/// Worker events (verdict errors, mostly) waiting for the client, past which
/// the relay reads no more client messages: one Ack of many unknown ids makes
/// as many errors, and a client that sends without reading would otherwise
/// grow this queue without bound.
const EVENT_BACKLOG: usize = 1024;

type Outbound = mpsc::Sender<Result<ConsumeResponse, Status>>;

/// Wraps a server message.
pub(super) fn response(kind: consume_response::Kind) -> ConsumeResponse {
    ConsumeResponse { kind: Some(kind) }
}

/// The workers behind one call, one per shard of its stream (one for a plain
/// stream), and which of them holds each delivery the call holds.
pub(super) struct Shards {
    workers: Vec<mpsc::Sender<Command>>,
    /// Branded id → the shard its delivery came from (sharded calls only).
    holders: HashMap<BrandedId, usize>,
    /// Deliveries whose branded id the call already holds from another shard
    /// (only entries written around Append can collide): handed over once
    /// that one is settled, so a verdict by branded id is never ambiguous.
    parked: Vec<(usize, BrandedId, Delivery)>,
    /// Deliveries Redis no longer has pending for this sidecar (a peer took
    /// them, or they were deleted), whose verdict is answered NOT_PENDING.
    gone: HashMap<BrandedId, Gone>,
}

impl Shards {
    /// The workers, in shard order.
    pub(super) fn new(workers: Vec<mpsc::Sender<Command>>) -> Shards {
        Shards { workers, holders: HashMap::new(), parked: Vec::new(), gone: HashMap::new() }
    }

    fn sharded(&self) -> bool {
        self.workers.len() > 1
    }

    /// The delivery to send now, or `None` when it is parked.
    fn deliver(&mut self, shard: usize, id: BrandedId, delivery: Delivery) -> Option<Delivery> {
        // Nearly always empty: no hashing per delivery then.
        if !self.gone.is_empty() {
            self.gone.remove(&id);
        }
        if !self.sharded() {
            return Some(delivery);
        }
        match self.holders.get(&id) {
            Some(&holder) if holder != shard => {
                self.parked.push((shard, id, delivery));
                None
            }
            _ => {
                self.holders.insert(id, shard);
                Some(delivery)
            }
        }
    }

    /// The shard holding `id`, which the verdict now settles; `None` when the
    /// call does not hold it (answered UNKNOWN_ID here).
    fn settle(&mut self, id: &BrandedId) -> Option<usize> {
        if !self.sharded() {
            return Some(0);
        }
        self.holders.remove(id)
    }

    /// Forgets the delivery of `id` from `shard`, which the worker no longer
    /// holds (its ack deadline passed, or it is `gone`), so the map does not
    /// keep entries whose verdict never comes: held, it makes way for the
    /// delivery parked behind it, returned to send now; parked (it ran out
    /// while it waited), it is dropped rather than handed out stale. A held
    /// one that is gone, with nothing parked behind it, is remembered so that
    /// its verdict is answered NOT_PENDING.
    fn release(&mut self, shard: usize, id: &BrandedId, gone: Option<Gone>) -> Option<Delivery> {
        let held = !self.sharded() || self.holders.get(id) == Some(&shard);
        if !held {
            self.parked.retain(|(parked_shard, parked, _)| (*parked_shard, parked) != (shard, id));
            return None;
        }
        self.holders.remove(id);
        let unparked = self.unpark(id);
        if let (None, Some(gone)) = (&unparked, gone) {
            if self.gone.len() >= GONE_REMEMBERED {
                self.gone.clear();
            }
            self.gone.insert(*id, gone);
        }
        unparked
    }

    /// A worker's UNKNOWN_ID for a delivery it let go of (lost or deleted)
    /// while the verdict was on its way to it: the `Released` that says why
    /// came first on the same channel, so the answer is NOT_PENDING, as it is
    /// for a verdict that arrives later.
    fn explain_unknown(&self, mut error: VerdictError) -> VerdictError {
        if error.code != VerdictErrorCode::UnknownId as i32 {
            return error;
        }
        if let Some(gone) = error.id.parse().ok().and_then(|id| self.gone(&id)) {
            error.code = VerdictErrorCode::NotPending as i32;
            error.message = gone.message().to_owned();
        }
        error
    }

    /// Why the call no longer holds `id`, if it was lost to a peer or deleted:
    /// every verdict on it is answered so, until it is delivered again.
    fn gone(&self, id: &BrandedId) -> Option<Gone> {
        self.gone.get(id).copied()
    }

    /// The parked delivery of `id`, if any, now that its namesake is settled.
    fn unpark(&mut self, id: &BrandedId) -> Option<Delivery> {
        let at = self.parked.iter().position(|(_, parked, _)| parked == id)?;
        let (shard, id, delivery) = self.parked.remove(at);
        self.holders.insert(id, shard);
        Some(delivery)
    }

    async fn send(&self, shard: usize, command: Command) -> Result<(), Status> {
        self.workers[shard].send(command).await.map_err(|_| Status::from(Error::ShuttingDown))
    }
}

/// Runs until the client closes its side, the call breaks, a second subscribe
/// arrives, or the sidecar closes calls on shutdown; then detaches the call
/// from its workers, which return what the call held to the PEL's waiting set.
pub(super) async fn relay(
    session: SessionId,
    mut inbound: Streaming<ConsumeRequest>,
    mut events: mpsc::UnboundedReceiver<Event>,
    outbound: Outbound,
    mut shards: Shards,
    mut closing: watch::Receiver<bool>,
) {
    // Whether the client still reads: after it closes its side, the errors
    // of its last verdicts are still sent before the call ends.
    let mut listening = true;
    let ending = loop {
        tokio::select! {
            message = inbound.message(), if events.len() < EVENT_BACKLOG => match message {
                Ok(Some(request)) => {
                    if let Err(status) = forward(session, request, &outbound, &mut shards).await {
                        break Some(status);
                    }
                }
                Ok(None) => break None,
                Err(status) if crate::error::is_oversized(&status) => {
                    break Some(crate::error::resource_exhausted_if_oversized(status));
                }
                Err(status) => {
                    debug!(session, %status, "call broke");
                    listening = false;
                    break None;
                }
            },
            event = events.recv() => {
                let frame = match event {
                    Some(Event::Delivery { shard, id, delivery }) => match shards.deliver(shard, id, delivery) {
                        Some(delivery) => response(consume_response::Kind::Delivery(delivery)),
                        None => continue,
                    },
                    Some(Event::VerdictError(error)) => {
                        response(consume_response::Kind::VerdictError(shards.explain_unknown(error)))
                    }
                    Some(Event::Released { shard, id, gone }) => match shards.release(shard, &id, gone) {
                        Some(delivery) => response(consume_response::Kind::Delivery(delivery)),
                        None => continue,
                    },
                    None => break Some(Error::ShuttingDown.into()),
                };
                if outbound.send(Ok(frame)).await.is_err() {
                    listening = false;
                    break None;
                }
            }
            true = async { closing.wait_for(|closing| *closing).await.is_ok() } => break Some(Error::ShuttingDown.into()),
        }
    };
    // The call ends only once its verdicts have reached Redis (bounded, should
    // Redis be down), so a client that sees it end can count on its acks.
    let mut applied = Vec::with_capacity(shards.workers.len());
    for worker in &shards.workers {
        let (flushed, done) = oneshot::channel();
        if worker.send(Command::Detach { session, flushed }).await.is_ok() {
            applied.push(done);
        }
    }
    let _ = tokio::time::timeout(DETACH_FLUSH_TIMEOUT, async {
        for done in applied {
            let _ = done.await;
        }
    })
    .await;
    // The flush the detach waited for answered the last verdicts; deliveries
    // still queued were returned to the PEL by the detach. A client that
    // closed its side and stopped reading does not hold the call open.
    let answers = async {
        while let (true, Ok(event)) = (listening, events.try_recv()) {
            let error = match event {
                Event::VerdictError(error) => shards.explain_unknown(error),
                Event::Released { shard, id, gone } => {
                    shards.release(shard, &id, gone);
                    continue;
                }
                Event::Delivery { .. } => continue,
            };
            listening = outbound.send(Ok(response(consume_response::Kind::VerdictError(error)))).await.is_ok();
        }
        if let Some(status) = ending {
            let _ = outbound.send(Err(status)).await;
        }
    };
    let _ = tokio::time::timeout(DETACH_FLUSH_TIMEOUT, answers).await;
    debug!(session, "call ended");
}

/// Validates one client message and passes it to the worker that holds its
/// entry. An error status ends the call; a bad verdict only gets a verdict error.
async fn forward(
    session: SessionId,
    request: ConsumeRequest,
    outbound: &Outbound,
    shards: &mut Shards,
) -> Result<(), Status> {
    match request.kind {
        Some(Kind::Subscribe(_)) => Err(Error::invalid(
            "subscribe",
            "this call is already subscribed; a call subscribes once (open another call for another subscription)",
        )
        .into()),
        None => Err(Error::invalid("kind", "a message must set subscribe, ack, fail, extend or drain").into()),
        Some(Kind::Ack(ack)) => {
            let mut by_shard: Vec<Vec<(String, BrandedId)>> = vec![Vec::new(); shards.workers.len()];
            let mut unparked = Vec::new();
            for (text, id) in parse_ids(ack.ids, outbound).await {
                if answered_gone(shards, outbound, &text, &id).await {
                    continue;
                }
                match shards.settle(&id) {
                    Some(shard) => {
                        unparked.extend(shards.unpark(&id));
                        by_shard[shard].push((text, id));
                    }
                    None => reject(outbound, &text, VerdictErrorCode::UnknownId, UNKNOWN_ID).await,
                }
            }
            for (shard, ids) in by_shard.into_iter().enumerate().filter(|(_, ids)| !ids.is_empty()) {
                shards.send(shard, Command::Ack { session, ids }).await?;
            }
            send_unparked(outbound, unparked).await;
            Ok(())
        }
        Some(Kind::Fail(fail)) => {
            let Some(id) = parse_id(&fail.id, outbound).await else { return Ok(()) };
            if answered_gone(shards, outbound, &fail.id, &id).await {
                return Ok(());
            }
            let retry_after = match super::duration("fail.retry_after", fail.retry_after) {
                Ok(delay) => delay,
                Err(e) => {
                    let message = format!("{e}; nothing was applied (a delivery this call holds stays held)");
                    reject(outbound, &fail.id, VerdictErrorCode::InvalidArgument, message).await;
                    return Ok(());
                }
            };
            let Some(shard) = shards.settle(&id) else {
                reject(outbound, &fail.id, VerdictErrorCode::UnknownId, UNKNOWN_ID).await;
                return Ok(());
            };
            let unparked = shards.unpark(&id);
            let mut reason = fail.reason;
            truncate_utf8(&mut reason, MAX_REASON_BYTES);
            let fail = FailVerdict { text: fail.id, id, retry_after, dead_letter: fail.dead_letter, reason };
            shards.send(shard, Command::Fail { session, fail }).await?;
            send_unparked(outbound, unparked).await;
            Ok(())
        }
        Some(Kind::Drain(_)) => {
            for shard in 0..shards.workers.len() {
                shards.send(shard, Command::Drain { session }).await?;
            }
            Ok(())
        }
        Some(Kind::Extend(extend)) => {
            let by = match super::duration("extend.by", extend.by) {
                Ok(Some(by)) if !by.is_zero() => by,
                _ => {
                    for id in &extend.ids {
                        let message = "extend.by is required, greater than zero and at most 365 days";
                        reject(outbound, id, VerdictErrorCode::InvalidArgument, message).await;
                    }
                    return Ok(());
                }
            };
            let mut by_shard: Vec<Vec<(String, BrandedId)>> = vec![Vec::new(); shards.workers.len()];
            for (text, id) in parse_ids(extend.ids, outbound).await {
                if answered_gone(shards, outbound, &text, &id).await {
                    continue;
                }
                match if shards.sharded() { shards.holders.get(&id).copied() } else { Some(0) } {
                    Some(shard) => by_shard[shard].push((text, id)),
                    None => reject(outbound, &text, VerdictErrorCode::UnknownId, UNKNOWN_ID).await,
                }
            }
            for (shard, ids) in by_shard.into_iter().enumerate().filter(|(_, ids)| !ids.is_empty()) {
                shards.send(shard, Command::Extend { session, ids, by }).await?;
            }
            Ok(())
        }
    }
}

async fn send_unparked(outbound: &Outbound, deliveries: impl IntoIterator<Item = Delivery>) {
    for delivery in deliveries {
        let _ = outbound.send(Ok(response(consume_response::Kind::Delivery(delivery)))).await;
    }
}

async fn parse_ids(texts: Vec<String>, outbound: &Outbound) -> Vec<(String, BrandedId)> {
    let mut ids = Vec::with_capacity(texts.len());
    for text in texts {
        if let Some(id) = parse_id(&text, outbound).await {
            ids.push((text, id));
        }
    }
    ids
}

async fn parse_id(text: &str, outbound: &Outbound) -> Option<BrandedId> {
    match text.parse() {
        Ok(id) => Some(id),
        Err(e) => {
            let shown: String = text.chars().take(64).collect();
            reject(outbound, &shown, VerdictErrorCode::InvalidArgument, e.to_string()).await;
            None
        }
    }
}

/// Answers a verdict on a delivery the call no longer holds because it was
/// lost to a peer or deleted (NOT_PENDING, saying which); false otherwise.
async fn answered_gone(shards: &Shards, outbound: &Outbound, text: &str, id: &BrandedId) -> bool {
    let Some(gone) = shards.gone(id) else { return false };
    reject(outbound, text, VerdictErrorCode::NotPending, gone.message()).await;
    true
}

async fn reject(outbound: &Outbound, id: &str, code: VerdictErrorCode, message: impl Into<String>) {
    let error = VerdictError { id: id.to_owned(), code: code as i32, message: message.into() };
    let _ = outbound.send(Ok(response(consume_response::Kind::VerdictError(error)))).await;
}

fn truncate_utf8(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: &str) -> BrandedId {
        format!("{n:0>28}").parse().expect("28 hex characters")
    }

    fn unknown(id: &BrandedId) -> VerdictError {
        VerdictError { id: id.to_string(), code: VerdictErrorCode::UnknownId as i32, message: UNKNOWN_ID.to_owned() }
    }

    fn shards(count: usize) -> Shards {
        Shards::new((0..count).map(|_| mpsc::channel(1).0).collect())
    }

    #[test]
    fn a_verdict_that_crossed_a_gone_delivery_is_answered_not_pending() {
        let mut plain = shards(1);
        let (lost, expired) = (id("a1"), id("b2"));
        plain.release(0, &lost, Some(Gone::ToPeer));
        plain.release(0, &expired, None);

        let crossed = plain.explain_unknown(unknown(&lost));
        assert_eq!(crossed.code, VerdictErrorCode::NotPending as i32);
        assert!(crossed.message.contains("lost to a peer"), "{crossed:?}");
        assert_eq!(plain.explain_unknown(unknown(&lost)).code, VerdictErrorCode::NotPending as i32, "every time");
        assert_eq!(plain.explain_unknown(unknown(&expired)).code, VerdictErrorCode::UnknownId as i32);
    }

    #[test]
    fn a_new_delivery_of_a_gone_id_supersedes_it() {
        let mut plain = shards(1);
        let deleted = id("c3");
        plain.release(0, &deleted, Some(Gone::Deleted));
        assert_eq!(plain.gone(&deleted), Some(Gone::Deleted));

        assert!(plain.deliver(0, deleted, Delivery::default()).is_some());
        assert_eq!(plain.gone(&deleted), None, "the verdict now goes to the new delivery");
    }

    #[test]
    fn a_gone_delivery_with_a_namesake_parked_behind_hands_over_and_is_not_remembered() {
        let mut sharded = shards(2);
        let same = id("d4");
        assert!(sharded.deliver(0, same, Delivery::default()).is_some());
        assert!(sharded.deliver(1, same, Delivery::default()).is_none(), "parked behind shard 0's");

        assert!(sharded.release(0, &same, Some(Gone::ToPeer)).is_some(), "shard 1's is handed over");
        assert_eq!(sharded.gone(&same), None, "a verdict now settles shard 1's delivery");
        assert_eq!(sharded.settle(&same), Some(1));
    }
}
