//! Where the ledger's decisions leave the worker: frames to the calls' channels,
//! delivery spans, and the metrics of what the ledger counted. The worker
//! calls [`Outlet::act`] before every await, so nothing the ledger decided
//! waits on Redis.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicUsize, Ordering},
};

use opentelemetry::trace::SpanContext;
use tokio::{sync::mpsc, time::Instant};
use tracing::warn;

use super::{
    commands::Event,
    delivery::{self, Outgoing},
    ledger::{Effect, Ledger},
    orders::{PendingAck, SessionId},
    IdMap,
};
use crate::{
    id::{BrandedId, StreamId},
    metrics::GroupMetrics,
    proto::{Emitted, EmittedEntry},
    wire::OutgoingDelivery,
};

/// One group's links to its calls, its open delivery spans and its metrics.
pub(super) struct Outlet {
    stream: String,
    group: String,
    pub(super) metrics: GroupMetrics,
    /// Each attached call's channel, where the ledger's effects for it go.
    links: HashMap<SessionId, mpsc::UnboundedSender<Event>>,
    /// The effects being carried out (kept for its allocation).
    effects: Vec<Effect<Box<OutgoingDelivery>>>,
    /// Traces are exported: each held delivery has a span, here until its
    /// verdict (or its leaving) ends it.
    traced: bool,
    /// At-most-once: nothing is acknowledged in Redis, so no settle span links.
    no_ack: bool,
    spans: IdMap<StreamId, tracing::Span>,
    /// The spans of acknowledged deliveries, for the settle span to link to.
    ack_links: IdMap<StreamId, SpanContext>,
    /// The spans of deliveries answered with an AckEmit, for its step's span
    /// to be the child of.
    emit_parents: IdMap<StreamId, SpanContext>,
    /// Entries found deleted while pending since the last log line, so a
    /// trim of many pending entries is logged once with their count.
    trimmed_unlogged: u64,
    /// The held count last added to the sidecar-wide one.
    published_held: usize,
}

impl Outlet {
    /// The outlet of `group` on `stream`; `traced`: delivery spans are made.
    pub(super) fn new(stream: &str, group: &str, metrics: GroupMetrics, traced: bool, no_ack: bool) -> Outlet {
        Outlet {
            stream: stream.to_owned(),
            group: group.to_owned(),
            metrics,
            links: HashMap::new(),
            effects: Vec::new(),
            traced,
            no_ack,
            spans: IdMap::default(),
            ack_links: IdMap::default(),
            emit_parents: IdMap::default(),
            trimmed_unlogged: 0,
            published_held: 0,
        }
    }

    /// Adds a call's channel (counted in `echomq_consume_calls`).
    pub(super) fn link(&mut self, session: SessionId, events: mpsc::UnboundedSender<Event>) {
        if self.links.insert(session, events).is_none() {
            self.metrics.consume_calls.inc();
        }
    }

    /// Forgets an ended call's channel, after carrying out what is queued for it.
    pub(super) fn unlink(&mut self, session: SessionId, ledger: &mut Ledger<Box<OutgoingDelivery>>) {
        self.act(ledger);
        if self.links.remove(&session).is_some() {
            self.metrics.consume_calls.dec();
        }
    }

    /// Carries out what the ledger queued, in order: frames to calls
    /// (giving back a delivery whose call is gone), span ends, then the
    /// metrics it counted.
    pub(super) fn act(&mut self, ledger: &mut Ledger<Box<OutgoingDelivery>>) {
        loop {
            ledger.take_effects(&mut self.effects);
            if self.effects.is_empty() {
                break;
            }
            let mut effects = std::mem::take(&mut self.effects);
            for effect in effects.drain(..) {
                self.carry_out(effect, ledger);
            }
            self.effects = effects;
        }
        let tally = ledger.tally();
        let metrics = &self.metrics;
        for (count, counter) in [
            (&mut tally.deliveries, &metrics.deliveries),
            (&mut tally.fails, &metrics.fails),
            (&mut tally.transient_fails, &metrics.transient_fails),
            (&mut tally.poison_fails, &metrics.poison_fails),
            (&mut tally.window_stalls, &metrics.window_stalls),
            (&mut tally.releases, &metrics.releases),
            (&mut tally.leases_lost, &metrics.leases_lost),
            (&mut tally.acks, &metrics.acks),
            (&mut tally.acks_not_pending, &metrics.acks_not_pending),
            (&mut tally.emits, &metrics.emits),
            (&mut tally.dead_letters, &metrics.dead_letters),
            (&mut tally.lease_refreshes, &metrics.lease_refreshes),
            (&mut tally.reclaimed, &metrics.reclaimed),
            (&mut tally.key_gate_checks, &metrics.key_gate_checks),
        ] {
            if *count > 0 {
                counter.inc_by(std::mem::take(count));
            }
        }
        if tally.trimmed > 0 {
            metrics.trimmed_while_pending.inc_by(tally.trimmed);
            self.trimmed_unlogged += std::mem::take(&mut tally.trimmed);
        }
        for seconds in tally.handler_seconds.drain(..) {
            metrics.handler_seconds.observe(seconds);
        }
    }

    fn carry_out(&mut self, effect: Effect<Box<OutgoingDelivery>>, ledger: &mut Ledger<Box<OutgoingDelivery>>) {
        match effect {
            Effect::Deliver { session, shard, out } => {
                let Outgoing { stream_id, branded, attempts, member, mut body } = out;
                let span = self.traced.then(|| delivery::span(&self.stream, &self.group, stream_id, &mut body));
                let event = Event::Delivery { shard, id: branded, delivery: body };
                let unsent = match self.links.get(&session) {
                    Some(link) => link.send(event).err().map(|unsent| unsent.0),
                    None => Some(event),
                };
                match unsent {
                    None => {
                        if let Some(span) = span {
                            self.spans.insert(stream_id, span);
                        }
                    }
                    Some(Event::Delivery { delivery, .. }) => ledger.undelivered(
                        session,
                        Outgoing { stream_id, branded, attempts, member, body: delivery },
                        Instant::now(),
                    ),
                    Some(_) => {}
                }
            }
            Effect::Answer { session, text, refusal } => {
                let error = refusal.error(&text);
                self.metrics.verdict_errors.count(error.code);
                if let Some(link) = self.links.get(&session) {
                    let _ = link.send(Event::VerdictError(Box::new(error)));
                }
            }
            Effect::Emitted { session, text, emitted } => {
                let entries = emitted
                    .into_iter()
                    .map(|(stream, stream_id)| EmittedEntry {
                        id: BrandedId::from_stream_id(stream_id).map(|id| id.to_string()).unwrap_or_default(),
                        stream_id: stream_id.to_string(),
                        stream,
                    })
                    .collect();
                if let Some(link) = self.links.get(&session) {
                    let _ = link.send(Event::Emitted(Box::new(Emitted { id: text, entries })));
                }
            }
            Effect::Left { session, shard, id, settled } => {
                if let Some(link) = self.links.get(&session) {
                    let _ = link.send(Event::Left { shard, id, settled });
                }
            }
            Effect::Ended { stream_id, verdict } => {
                let Some(span) = self.spans.remove(&stream_id) else { return };
                if let Some(verdict) = verdict {
                    span.record("echomq.verdict", verdict);
                    if verdict == "ack" && !self.no_ack {
                        if let Some(context) = crate::telemetry::span_context_of(&span) {
                            self.ack_links.insert(stream_id, context);
                        }
                    }
                    if verdict == "ack_emit" {
                        if let Some(context) = crate::telemetry::span_context_of(&span) {
                            self.emit_parents.insert(stream_id, context);
                        }
                    }
                }
            }
        }
    }

    /// The spans of these acknowledged deliveries, each with its id as the
    /// client sent it, for the settle span to link to (empty when not traced).
    pub(super) fn take_ack_links(&mut self, acks: &[PendingAck]) -> Vec<(SpanContext, String)> {
        if self.ack_links.is_empty() {
            return Vec::new();
        }
        let ack_links = &mut self.ack_links;
        acks.iter().filter_map(|ack| Some((ack_links.remove(&ack.stream_id)?, ack.text.clone()))).collect()
    }

    /// The span of the delivery of `stream_id`, answered by an AckEmit, for
    /// the step's span to be its child (`None` when not traced).
    pub(super) fn take_emit_parent(&mut self, stream_id: StreamId) -> Option<SpanContext> {
        self.emit_parents.remove(&stream_id)
    }

    /// Keeps the sidecar-wide held count (what shutdown waits for) and the
    /// `echomq_in_flight` gauge in step with the ledger's one count.
    pub(super) fn publish_held(&mut self, held: usize, sidecar_held: &AtomicUsize) {
        if held == self.published_held {
            return;
        }
        if held > self.published_held {
            sidecar_held.fetch_add(held - self.published_held, Ordering::Relaxed);
        } else {
            sidecar_held.fetch_sub(self.published_held - held, Ordering::Relaxed);
        }
        self.metrics.in_flight.set(held as i64);
        self.published_held = held;
    }

    /// Logs, once with their count, the entries found deleted while pending
    /// since the last call.
    pub(super) fn log_trimmed(&mut self) {
        if self.trimmed_unlogged > 0 {
            let entries = std::mem::take(&mut self.trimmed_unlogged);
            warn!(stream = %self.stream, group = %self.group, entries, "entries were deleted from the stream while pending (trimmed, XDEL); dropped from the PEL, never delivered again");
        }
    }
}
