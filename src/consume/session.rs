//! One Consume call after its subscribe: relays the client's verdicts to the
//! group worker and the worker's deliveries and verdict answers to the client.
//!
//! The relay routes and parks; it decides no verdict. Whether a call holds
//! an id, and why not, is the worker's ledger's to say: the relay answers
//! only messages it cannot route (an id that does not parse, an Extend
//! without a valid `by`, an AckEmit whose emits break a rule of
//! [`EmitRules`]: those never reach the worker, so nothing is written and
//! the delivery stays held).
//!
//! A call on a sharded stream is served by one worker per shard: the relay
//! remembers which shard each delivery it holds came from and sends each
//! verdict there. It forgets a route only when that worker says the
//! delivery left the call (`Event::Left`: settled by a verdict, past its
//! deadline, taken by a peer, deleted), never by guessing which verdicts
//! the worker will apply. While the client does not read, the relay waits on the
//! outbound channel and reads no new verdicts either, nor while the
//! worker's answers pile up, so gRPC flow control pushes back on the client
//! and nothing grows without bound. One Ack can name 100,000 ids, each of
//! which may be answered: the ids of an Ack, a Release or an Extend go to the
//! workers in pieces, each only once there is room for it among the call's
//! ids in flight ([`IDS_IN_FLIGHT`]), so the answers are bounded by ids, not
//! by messages.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tonic::{Status, Streaming};
use tracing::debug;

use super::{
    commands::{AckEmit, Command, Event, Extend, InFlight, Verdicts},
    emits::EmitRules,
    ledger::FailVerdict,
    orders::{FailKind, SessionId},
    verdicts, IdMap,
};
use crate::{
    error::Error,
    id::BrandedId,
    metrics::VerdictErrors,
    proto::{consume_request::Kind, consume_response, ConsumeRequest, ConsumeResponse, VerdictError},
    wire::{DeliveryBatch, OutgoingDelivery},
};

/// How long an ending call waits for its last verdicts to reach Redis.
const DETACH_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// A Fail reason is cut to this many bytes.
const MAX_REASON_BYTES: usize = 4096;
/// Routes of deliveries that left their shard's worker (deadline, peer,
/// deletion) kept for a late verdict, at most; past it they are forgotten,
/// and such a verdict goes to the first shard (which answers UNKNOWN_ID).
const LEFT_REMEMBERED: usize = 4096;
/// Worker events (verdict answers, mostly) waiting for the client, past which
/// the relay reads no more client messages: one Ack of many unknown ids makes
/// as many answers, and a client that sends without reading would otherwise
/// grow this queue without bound.
const EVENT_BACKLOG: usize = 1024;
/// Ids of a call's Acks, Releases and Extends sent to its workers and not yet
/// handled, at most. With [`EVENT_BACKLOG`], this bounds the answers a client
/// that does not read can pile up (some 400 bytes each) to about 9,000,
/// whatever it sends. Room enough that a call acking a 10,000 window in
/// large messages does not wait on its worker's Redis round trips.
const IDS_IN_FLIGHT: usize = 8192;
/// A message naming more ids goes to its worker in pieces of at most this many.
const IDS_PER_PIECE: usize = 1024;

/// What goes to the client. Boxed: tokio's channel allocates room for 32
/// items when it is made, and an unboxed `ConsumeResponse` (224 bytes) made
/// that 7 KB per call, idle or not.
pub(super) type Frame = Result<Box<ConsumeResponse>, Status>;

type Outbound = mpsc::Sender<Frame>;

/// Room in a batch frame for the ConsumeResponse and DeliveryBatch wrappers (bytes).
const BATCH_OVERHEAD: usize = 16;

/// How a call wants its deliveries framed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Framing {
    /// Deliveries per frame; 1: each in a `Delivery` frame of its own.
    pub(super) max_batch: usize,
    /// The largest frame the client accepts (bytes, `--max-message-bytes`).
    pub(super) max_bytes: usize,
}

/// What a batch left for the next frame: a delivery that did not fit (already
/// routed), or the first event that was not a delivery.
enum Next {
    Routed(OutgoingDelivery),
    Event(Event),
}

/// The frame for `first` (already routed) and, when the call takes batches,
/// the deliveries queued right behind it: up to `max_batch` and `max_bytes`,
/// never waiting for more. What stops the batch is left in `next`.
fn delivery_frame(
    first: OutgoingDelivery,
    events: &mut mpsc::UnboundedReceiver<Event>,
    shards: &mut Shards,
    framing: Framing,
    next: &mut Option<Next>,
) -> Box<ConsumeResponse> {
    if framing.max_batch <= 1 {
        return response(consume_response::Kind::Delivery(first.into_proto()));
    }
    let framed = |d: &OutgoingDelivery| {
        let len = d.encoded_len();
        1 + prost::length_delimiter_len(len) + len
    };
    let mut size = BATCH_OVERHEAD + framed(&first);
    // Sized once: grown from one, a batch of 64 went through six reallocations.
    let mut deliveries = Vec::with_capacity(framing.max_batch.min(events.len() + 1));
    deliveries.push(first);
    while deliveries.len() < framing.max_batch {
        let Ok(event) = events.try_recv() else { break };
        let Event::Delivery { shard, id, delivery } = event else {
            *next = Some(Next::Event(event));
            break;
        };
        let Some(delivery) = shards.deliver(shard, id, *delivery) else { continue };
        size += framed(&delivery);
        if size > framing.max_bytes {
            *next = Some(Next::Routed(delivery));
            break;
        }
        deliveries.push(delivery);
    }
    response(consume_response::Kind::Batch(DeliveryBatch::outgoing(deliveries)))
}

/// The frame for one worker event, if it makes one: a delivery (gathering
/// those queued behind it into a batch), a verdict answer, or a delivery a
/// departure unparked.
fn event_frame(
    event: Event,
    events: &mut mpsc::UnboundedReceiver<Event>,
    shards: &mut Shards,
    framing: Framing,
    next: &mut Option<Next>,
) -> Option<Box<ConsumeResponse>> {
    let delivery = match event {
        Event::Delivery { shard, id, delivery } => shards.deliver(shard, id, *delivery)?,
        Event::VerdictError(error) => return Some(response(consume_response::Kind::VerdictError(*error))),
        Event::Emitted(emitted) => return Some(response(consume_response::Kind::Emitted(*emitted))),
        Event::Left { shard, id, settled } => shards.left(shard, &id, settled)?,
    };
    Some(delivery_frame(delivery, events, shards, framing, next))
}

/// Wraps a server message.
pub(super) fn response(kind: consume_response::Kind) -> Box<ConsumeResponse> {
    Box::new(ConsumeResponse { kind: Some(kind) })
}

/// The workers behind one call, one per shard of its stream (one for a plain
/// stream), and the routes of a sharded call's verdicts.
pub(super) struct Shards {
    workers: Vec<mpsc::Sender<Command>>,
    /// Each worker's stream key, in shard order: an AckEmit's emits must
    /// share the slot of the stream its delivery came from.
    streams: Vec<String>,
    /// Branded id → the shard whose delivery the call holds (sharded calls only).
    routes: IdMap<BrandedId, usize>,
    /// Branded id → the shard a delivery left (a verdict may still come; that
    /// shard's worker answers it), when nothing was parked behind it.
    left: IdMap<BrandedId, usize>,
    /// Deliveries whose branded id the call already holds from another shard
    /// (only entries written around Append can collide): handed over once
    /// that one is settled or left, so a verdict by branded id is never ambiguous.
    parked: Vec<(usize, BrandedId, OutgoingDelivery)>,
}

impl Shards {
    /// The workers and their stream keys, in shard order.
    pub(super) fn new(workers: Vec<mpsc::Sender<Command>>, streams: Vec<String>) -> Shards {
        Shards { workers, streams, routes: IdMap::default(), left: IdMap::default(), parked: Vec::new() }
    }

    fn sharded(&self) -> bool {
        self.workers.len() > 1
    }

    /// The delivery to send now, or `None` when it is parked.
    fn deliver(&mut self, shard: usize, id: BrandedId, delivery: OutgoingDelivery) -> Option<OutgoingDelivery> {
        if !self.sharded() {
            return Some(delivery);
        }
        self.left.remove(&id);
        match self.routes.get(&id) {
            Some(&holder) if holder != shard => {
                self.parked.push((shard, id, delivery));
                None
            }
            _ => {
                self.routes.insert(id, shard);
                Some(delivery)
            }
        }
    }

    /// The shard a verdict on `id` goes to.
    fn route(&self, id: &BrandedId) -> usize {
        if !self.sharded() {
            return 0;
        }
        self.routes.get(id).or_else(|| self.left.get(id)).copied().unwrap_or(0)
    }

    /// The delivery of `id` from `shard` left the call (settled by a verdict,
    /// or taken from it by its worker): held, it makes way
    /// for the delivery parked behind it, returned to send now (else its
    /// route is kept for a late verdict); parked, it is dropped rather than
    /// handed out stale.
    fn left(&mut self, shard: usize, id: &BrandedId, settled: bool) -> Option<OutgoingDelivery> {
        if !self.sharded() {
            return None;
        }
        if self.routes.get(id) != Some(&shard) {
            self.parked.retain(|(parked_shard, parked, _)| (*parked_shard, parked) != (shard, id));
            return None;
        }
        self.routes.remove(id);
        let unparked = self.unpark(id);
        // Taken from the call, its late verdict still goes to its shard (to
        // be answered NOT_PENDING there); settled, no verdict needs the
        // route, and remembering every settled id would push those out.
        if unparked.is_none() && !settled {
            if self.left.len() >= LEFT_REMEMBERED {
                self.left.clear();
            }
            self.left.insert(*id, shard);
        }
        unparked
    }

    /// The parked delivery of `id`, if any, now that its namesake is settled.
    fn unpark(&mut self, id: &BrandedId) -> Option<OutgoingDelivery> {
        let at = self.parked.iter().position(|(_, parked, _)| parked == id)?;
        let (shard, id, delivery) = self.parked.remove(at);
        self.routes.insert(id, shard);
        Some(delivery)
    }

    async fn send(&self, shard: usize, command: Command) -> Result<(), Status> {
        self.workers[shard].send(command).await.map_err(|_| Status::from(Error::ShuttingDown))
    }
}

/// The ids of an Ack, a Release or an Extend bound for one worker, at most
/// [`IDS_PER_PIECE`], waiting for room among the call's ids in flight.
struct Piece {
    shard: usize,
    ids: Vec<(String, BrandedId)>,
    verdict: Verdict,
}

#[derive(Clone, Copy)]
enum Verdict {
    Ack,
    Release,
    Extend(Duration),
}

impl Piece {
    /// The room this piece takes among the call's ids in flight.
    fn room(&self) -> u32 {
        self.ids.len() as u32
    }

    fn command(self, session: SessionId, in_flight: InFlight) -> Command {
        let Piece { ids, verdict, .. } = self;
        match verdict {
            Verdict::Ack => Command::Ack(Box::new(Verdicts { session, ids, in_flight })),
            Verdict::Release => Command::Release(Box::new(Verdicts { session, ids, in_flight })),
            Verdict::Extend(by) => Command::Extend { session, extend: Box::new(Extend { ids, by, in_flight }) },
        }
    }
}

/// Queues `ids` for `shard` in pieces of at most [`IDS_PER_PIECE`] (one
/// piece, not copied, when they fit).
fn queue_pieces(pieces: &mut VecDeque<Piece>, shard: usize, ids: Vec<(String, BrandedId)>, verdict: Verdict) {
    if ids.len() <= IDS_PER_PIECE {
        pieces.push_back(Piece { shard, ids, verdict });
        return;
    }
    let mut rest = ids.into_iter();
    loop {
        let ids: Vec<_> = rest.by_ref().take(IDS_PER_PIECE).collect();
        if ids.is_empty() {
            return;
        }
        pieces.push_back(Piece { shard, ids, verdict });
    }
}

/// What a call's relay works with: the call's two directions and where its
/// verdicts go.
pub(super) struct Relay {
    pub(super) session: SessionId,
    pub(super) inbound: Streaming<ConsumeRequest>,
    pub(super) events: mpsc::UnboundedReceiver<Event>,
    pub(super) outbound: Outbound,
    pub(super) shards: Shards,
    pub(super) framing: Framing,
    pub(super) closing: watch::Receiver<bool>,
    /// The verdict errors the relay answers itself are counted here (the
    /// call's first shard's: such a verdict names no shard).
    pub(super) verdict_errors: VerdictErrors,
    pub(super) emit_rules: EmitRules,
    /// The most ids one Ack, Release or Extend may name: no call holds more
    /// than `--max-in-flight-limit` deliveries. A message naming more ends
    /// the call (INVALID_ARGUMENT) rather than sit decoded in the sidecar
    /// while its pieces wait for a client that does not read.
    pub(super) max_ids: usize,
}

/// Runs until the client closes its side, the call breaks, a second subscribe
/// arrives, or the sidecar closes calls on shutdown; then detaches the call
/// from its workers, which return what the call held to the PEL's waiting set.
///
/// `relay` comes boxed, and the ending runs boxed too: the task lives as long
/// as the call, and an async fn keeps room for its arguments beside the
/// locals they move into, and for its largest step, for its whole life.
pub(super) async fn relay(relay: Box<Relay>) {
    let Relay {
        session,
        mut inbound,
        mut events,
        outbound,
        mut shards,
        framing,
        mut closing,
        verdict_errors,
        emit_rules,
        max_ids,
    } = *relay;
    // Whether the client still reads: after it closes its side, the errors
    // of its last verdicts are still sent before the call ends.
    let mut listening = true;
    // What the last batch left for the next frame.
    let mut next: Option<Next> = None;
    // Verdict ids not yet sent to the workers, in the order the client sent
    // them; no new message is read until they are all sent.
    let mut pieces: VecDeque<Piece> = VecDeque::new();
    let room = Arc::new(Semaphore::new(IDS_IN_FLIGHT));
    let ending = loop {
        if let Some(left) = next.take() {
            let frame = match left {
                Next::Routed(delivery) => Some(delivery_frame(delivery, &mut events, &mut shards, framing, &mut next)),
                Next::Event(event) => event_frame(event, &mut events, &mut shards, framing, &mut next),
            };
            if let Some(frame) = frame {
                if outbound.send(Ok(frame)).await.is_err() {
                    listening = false;
                    break None;
                }
            }
            continue;
        }
        let answers_room = events.len() < EVENT_BACKLOG;
        if let (true, Some(piece)) = (answers_room, pieces.front()) {
            if let Ok(in_flight) = room.clone().try_acquire_many_owned(piece.room()) {
                let piece = pieces.pop_front().expect("a piece is queued");
                if let Err(status) = shards.send(piece.shard, piece.command(session, in_flight)).await {
                    break Some(status);
                }
                continue;
            }
        }
        let wanted = pieces.front().map_or(1, Piece::room);
        tokio::select! {
            // Room for the next piece came back: the top of the loop sends it.
            _ = room.acquire_many(wanted), if answers_room && !pieces.is_empty() => {}
            message = inbound.message(), if answers_room && pieces.is_empty() => match message {
                Ok(Some(request)) => {
                    // Boxed, so that an idle call's relay does not keep room for it.
                    let forwarded = Box::pin(forward(
                        session,
                        request,
                        &outbound,
                        &mut shards,
                        &mut pieces,
                        &verdict_errors,
                        &emit_rules,
                        max_ids,
                    ));
                    if let Err(status) = forwarded.await {
                        break Some(status);
                    }
                }
                Ok(None) => break None,
                Err(status) if crate::error::is_oversized(&status) || crate::error::is_undecodable(&status) => {
                    break Some(crate::error::inbound_status(status));
                }
                // Nobody reads the ending status of a broken call, but the
                // gRPC server's metrics do: it ends as it broke (CANCELLED
                // for a client that went away), not OK.
                Err(status) => {
                    debug!(session, %status, "call broke");
                    listening = false;
                    break Some(status);
                }
            },
            event = events.recv() => {
                let Some(event) = event else { break Some(Error::ShuttingDown.into()) };
                let Some(frame) = event_frame(event, &mut events, &mut shards, framing, &mut next) else { continue };
                if outbound.send(Ok(frame)).await.is_err() {
                    listening = false;
                    break None;
                }
            }
            true = async { closing.wait_for(|closing| *closing).await.is_ok() } => break Some(Error::ShuttingDown.into()),
        }
    };
    Box::pin(end(session, ending, listening, next, events, outbound, shards, Unsent { pieces, room })).await;
}

/// The verdict ids a call had not sent to its workers when it ended, and the
/// room they wait for.
struct Unsent {
    pieces: VecDeque<Piece>,
    room: Arc<Semaphore>,
}

impl Unsent {
    /// Sends the pieces, each once there is room for it: the worker handles
    /// them whether or not the client reads their answers.
    async fn send(self, session: SessionId, shards: &Shards) {
        for piece in self.pieces {
            let Ok(in_flight) = self.room.clone().acquire_many_owned(piece.room()).await else { return };
            if shards.send(piece.shard, piece.command(session, in_flight)).await.is_err() {
                return;
            }
        }
    }
}

/// The end of a call: detaches it from its workers, waits (bounded) until
/// its verdicts have reached Redis, sends the answers still queued and the
/// ending status.
#[allow(clippy::too_many_arguments)]
async fn end(
    session: SessionId,
    ending: Option<Status>,
    mut listening: bool,
    next: Option<Next>,
    mut events: mpsc::UnboundedReceiver<Event>,
    outbound: Outbound,
    mut shards: Shards,
    unsent: Unsent,
) {
    // Verdicts the client sent still reach the workers when the call breaks
    // or the sidecar shuts down mid-message (bounded, should a worker stall).
    let _ = tokio::time::timeout(DETACH_FLUSH_TIMEOUT, unsent.send(session, &shards)).await;
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
    let stashed = match next {
        Some(Next::Event(event)) => Some(event),
        _ => None,
    };
    let answers = async {
        let mut queued = stashed.into_iter().chain(std::iter::from_fn(|| events.try_recv().ok()));
        while let (true, Some(event)) = (listening, queued.next()) {
            let frame = match event {
                Event::VerdictError(error) => consume_response::Kind::VerdictError(*error),
                Event::Emitted(emitted) => consume_response::Kind::Emitted(*emitted),
                Event::Left { shard, id, settled } => {
                    shards.left(shard, &id, settled);
                    continue;
                }
                Event::Delivery { .. } => continue,
            };
            listening = outbound.send(Ok(response(frame))).await.is_ok();
        }
        if let Some(status) = ending {
            let _ = outbound.send(Err(status)).await;
        }
    };
    let _ = tokio::time::timeout(DETACH_FLUSH_TIMEOUT, answers).await;
    debug!(session, "call ended");
}

/// Validates one client message and passes it to the worker that holds its
/// entry; the ids of an Ack, a Release or an Extend are queued in `pieces`
/// for the relay to send as room allows. An error status ends the call: a
/// second subscribe, an empty message, or an Ack, a Release or an Extend of
/// more than `max_ids` ids (INVALID_ARGUMENT); a bad verdict only gets a
/// verdict error.
#[allow(clippy::too_many_arguments)]
async fn forward(
    session: SessionId,
    request: ConsumeRequest,
    outbound: &Outbound,
    shards: &mut Shards,
    pieces: &mut VecDeque<Piece>,
    counted: &VerdictErrors,
    emit_rules: &EmitRules,
    max_ids: usize,
) -> Result<(), Status> {
    let named = match &request.kind {
        Some(Kind::Ack(ack)) => Some(("ack.ids", ack.ids.len())),
        Some(Kind::Release(release)) => Some(("release.ids", release.ids.len())),
        Some(Kind::Extend(extend)) => Some(("extend.ids", extend.ids.len())),
        _ => None,
    };
    if let Some((field, named)) = named.filter(|&(_, named)| named > max_ids) {
        let reason = format!(
            "{named} ids in one message, where at most {max_ids} may be (no call holds more deliveries: the sidecar's --max-in-flight-limit); send them in several messages"
        );
        return Err(Error::invalid(field, reason).into());
    }
    match request.kind {
        Some(Kind::Subscribe(_)) => Err(Error::invalid(
            "subscribe",
            "this call is already subscribed; a call subscribes once (open another call for another subscription)",
        )
        .into()),
        None => {
            Err(Error::invalid("kind", "a message must set subscribe, ack, fail, extend, drain, release or ack_emit")
                .into())
        }
        Some(Kind::AckEmit(ack_emit)) => {
            let Some(id) = parse_id(&ack_emit.id, outbound, counted).await else { return Ok(()) };
            let shard = shards.route(&id);
            match emit_rules.check(&shards.streams[shard], ack_emit.emits) {
                Ok(emits) => {
                    shards
                        .send(
                            shard,
                            Command::AckEmit { session, ack_emit: Box::new(AckEmit { text: ack_emit.id, id, emits }) },
                        )
                        .await?
                }
                Err(refusal) => reject(outbound, counted, refusal.error(&ack_emit.id)).await,
            }
            Ok(())
        }
        Some(Kind::Ack(ack)) => {
            for (shard, ids) in by_shard(ack.ids, outbound, shards, counted).await {
                queue_pieces(pieces, shard, ids, Verdict::Ack);
            }
            Ok(())
        }
        Some(Kind::Release(release)) => {
            for (shard, ids) in by_shard(release.ids, outbound, shards, counted).await {
                queue_pieces(pieces, shard, ids, Verdict::Release);
            }
            Ok(())
        }
        Some(Kind::Fail(fail)) => {
            let Some(id) = parse_id(&fail.id, outbound, counted).await else { return Ok(()) };
            let retry_after =
                super::subscribe::duration("fail.retry_after", fail.retry_after).map_err(|e| e.to_string());
            let shard = shards.route(&id);
            let mut reason = fail.reason;
            truncate_utf8(&mut reason, MAX_REASON_BYTES);
            let kind = fail_kind(fail.kind, fail.dead_letter);
            let fail = FailVerdict { text: fail.id, id, retry_after, kind, reason };
            shards.send(shard, Command::Fail { session, fail: Box::new(fail) }).await?;
            Ok(())
        }
        Some(Kind::Drain(_)) => {
            for shard in 0..shards.workers.len() {
                shards.send(shard, Command::Drain { session }).await?;
            }
            Ok(())
        }
        Some(Kind::Extend(extend)) => {
            let by = match super::subscribe::duration("extend.by", extend.by) {
                Ok(Some(by)) if !by.is_zero() => by,
                _ => {
                    for id in &extend.ids {
                        reject(outbound, counted, verdicts::bad_extension(id)).await;
                    }
                    return Ok(());
                }
            };
            for (shard, ids) in by_shard(extend.ids, outbound, shards, counted).await {
                queue_pieces(pieces, shard, ids, Verdict::Extend(by));
            }
            Ok(())
        }
    }
}

/// The ids of an Ack, a Release or an Extend, parsed (the others answered
/// INVALID_ARGUMENT), grouped by the shard each goes to; shards with none left out.
async fn by_shard(
    texts: Vec<String>,
    outbound: &Outbound,
    shards: &Shards,
    counted: &VerdictErrors,
) -> Vec<(usize, Vec<(String, BrandedId)>)> {
    let ids = parse_ids(texts, outbound, counted).await;
    if !shards.sharded() {
        return if ids.is_empty() { Vec::new() } else { vec![(0, ids)] };
    }
    let mut by_shard: Vec<Vec<(String, BrandedId)>> = vec![Vec::new(); shards.workers.len()];
    for (text, id) in ids {
        by_shard[shards.route(&id)].push((text, id));
    }
    by_shard.into_iter().enumerate().filter(|(_, ids)| !ids.is_empty()).collect()
}

async fn parse_ids(texts: Vec<String>, outbound: &Outbound, counted: &VerdictErrors) -> Vec<(String, BrandedId)> {
    let mut ids = Vec::with_capacity(texts.len());
    for text in texts {
        if let Some(id) = parse_id(&text, outbound, counted).await {
            ids.push((text, id));
        }
    }
    ids
}

async fn parse_id(text: &str, outbound: &Outbound, counted: &VerdictErrors) -> Option<BrandedId> {
    match text.parse() {
        Ok(id) => Some(id),
        Err(e) => {
            let shown: String = text.chars().take(64).collect();
            reject(outbound, counted, verdicts::invalid(&shown, e.to_string())).await;
            None
        }
    }
}

/// Answers a verdict the relay cannot route, counted like the worker's answers.
async fn reject(outbound: &Outbound, counted: &VerdictErrors, error: VerdictError) {
    counted.count(error.code);
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

/// The kind of a Fail: `kind`, with `dead_letter` the same as POISON.
/// `Err` (answered INVALID_ARGUMENT): an unknown kind, or TRANSIENT with
/// `dead_letter`, which ask for opposite things.
fn fail_kind(kind: i32, dead_letter: bool) -> Result<FailKind, String> {
    use crate::proto::FailKind as Wire;
    match (Wire::try_from(kind), dead_letter) {
        (Err(_), _) => Err(format!("fail.kind: {kind} is not a FailKind (MESSAGE 1, TRANSIENT 2, POISON 3)")),
        (Ok(Wire::Transient), true) => Err(
            "fail.kind: FAIL_KIND_TRANSIENT with dead_letter: a transient failure is retried without counting, a dead letter is never retried; send one".to_owned(),
        ),
        (Ok(Wire::Poison), _) | (_, true) => Ok(FailKind::Poison),
        (Ok(Wire::Transient), false) => Ok(FailKind::Transient),
        (Ok(Wire::Unspecified | Wire::Message), false) => Ok(FailKind::Message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: &str) -> BrandedId {
        format!("{n:0>28}").parse().expect("28 hex characters")
    }

    fn shards(count: usize) -> Shards {
        Shards::new((0..count).map(|_| mpsc::channel(1).0).collect(), (0..count).map(|k| format!("s{k}")).collect())
    }

    #[test]
    fn a_large_verdict_goes_in_pieces_in_the_order_sent() {
        let ids: Vec<(String, BrandedId)> = (1..=2500u64)
            .map(|n| {
                let text = format!("{n:028x}");
                let id = id(&text);
                (text, id)
            })
            .collect();
        let mut pieces = VecDeque::new();
        queue_pieces(&mut pieces, 1, ids[..3].to_vec(), Verdict::Release);
        queue_pieces(&mut pieces, 2, ids.clone(), Verdict::Ack);

        let sizes: Vec<_> = pieces.iter().map(|p| (p.shard, p.room())).collect();
        assert_eq!(sizes, [(1, 3), (2, 1024), (2, 1024), (2, 452)]);
        let acked: Vec<_> = pieces.iter().skip(1).flat_map(|p| p.ids.iter().cloned()).collect();
        assert_eq!(acked, ids, "every id once, in order");
    }

    /// A delivery whose contents these tests never look at.
    fn blank() -> OutgoingDelivery {
        let stream_id = crate::id::StreamId { ms: 1, seq: 1 };
        let origin = std::sync::Arc::new(crate::wire::Origin { stream: "s".into(), group: "g".into() });
        let branded = BrandedId::from_stream_id(stream_id).unwrap();
        OutgoingDelivery::new(branded, stream_id, origin, Vec::new(), 1, String::new(), Vec::new())
    }

    #[test]
    fn a_plain_call_routes_every_verdict_to_its_one_worker_and_keeps_nothing() {
        let mut plain = shards(1);
        let held = id("a1");
        assert!(plain.deliver(0, held, blank()).is_some());
        assert_eq!(plain.route(&held), 0);
        assert_eq!(plain.left(0, &held, true), None);
        assert_eq!(plain.route(&id("b2")), 0);
        assert!(plain.routes.is_empty() && plain.left.is_empty() && plain.parked.is_empty());
    }

    #[test]
    fn a_verdict_goes_to_the_shard_that_delivered_even_after_the_delivery_left() {
        let mut sharded = shards(3);
        let (held, gone) = (id("c3"), id("d4"));
        assert!(sharded.deliver(2, held, blank()).is_some());
        assert!(sharded.deliver(1, gone, blank()).is_some());
        assert_eq!(sharded.left(1, &gone, false), None);
        assert_eq!(sharded.route(&gone), 1, "its worker says why the call no longer holds it");
        assert_eq!(sharded.route(&held), 2);
        assert_eq!(sharded.left(2, &held, true), None, "settled there: nothing parked behind it");
        assert_eq!(sharded.route(&held), 0, "settled: a late verdict goes to the first shard, as for any id not held");
        assert!(!sharded.left.contains_key(&held), "settled ids are not remembered, so taken ones are not pushed out");
        assert_eq!(sharded.route(&id("e5")), 0, "an id never delivered goes to the first shard, which answers it");
        assert!(sharded.deliver(0, gone, blank()).is_some());
        assert_eq!(sharded.route(&gone), 0, "a new delivery supersedes the route");
    }

    #[test]
    fn a_namesake_from_another_shard_waits_until_the_first_is_settled_or_left() {
        let mut sharded = shards(2);
        let same = id("f6");
        assert!(sharded.deliver(0, same, blank()).is_some());
        assert!(sharded.deliver(1, same, blank()).is_none(), "parked behind shard 0's");
        assert_eq!(sharded.route(&same), 0, "a verdict goes to the holder, which says whether it settles");
        assert!(sharded.left(0, &same, true).is_some(), "settled on shard 0: shard 1's is handed over");
        assert_eq!(sharded.route(&same), 1);

        assert!(sharded.deliver(0, same, blank()).is_none(), "parked behind shard 1's");
        assert!(sharded.left(1, &same, false).is_some(), "shard 1's left: shard 0's is handed over");
        assert_eq!(sharded.route(&same), 0);
        assert!(sharded.deliver(1, same, blank()).is_none());
        assert_eq!(sharded.left(1, &same, false), None, "a parked delivery that left is dropped");
        assert!(sharded.parked.is_empty());
        assert_eq!(sharded.route(&same), 0);
    }
}
