//! The group worker's bookkeeping, with no I/O: which call holds what, the
//! entries waiting to come back, credit, ack deadlines, and what Redis took
//! away. Every transition is synchronous and does nothing itself: it takes
//! the clock and a command or a Redis outcome, and queues what follows as
//! [`Effect`]s (frames for calls, span ends), [`Orders`] (the Redis writes)
//! and a [`Tally`] (metrics), which the worker carries out. It sends on no
//! channel, records no metric, opens no span and holds no wire type (the
//! contents of a delivery are a type parameter it never looks into). So the
//! rules below are tested without Redis, a runtime or a metrics registry.
//!
//! Every entry the worker knows of is in exactly one state:
//! - held: handed to a call, waiting for its verdict; its lease kept fresh;
//! - ready: read from Redis (its delivery counted) but not handed over yet,
//!   because no call had a free slot when it arrived;
//! - waiting: pending in this consumer's PEL, due for (re-)delivery at an
//!   instant (after a Fail, a disconnect, or found by recovery or reclaim);
//! - key-waiting: read or claimed (its delivery counted, its contents here)
//!   but held back by the per-key gate, because its key is at its limit in
//!   the group (see [`super::keyed`]); leased like a held one, and not
//!   counted against any call's credit.
//!
//! Credit: the worker never has more entries read, ready or being claimed
//! than its calls have free `max_in_flight` slots, so its memory is bounded by
//! the calls' credit whatever the backlog in Redis.
//!
//! Why one file of ~600 lines: its rules are one invariant (each entry in
//! exactly one state, credit derived from those states, never counted by
//! hand), and splitting it would spread that invariant over files. Its
//! tests live in `ledger/tests.rs`.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    time::Duration,
};

use tokio::time::Instant;

use super::{
    delivery::Outgoing,
    key_waits::KeyWaits,
    keyed::{self, Checked},
    orders::{
        Backoff, DeadLetterOrder, DeadLettered, Emission, EmitOrder, FailKind, GroupPolicy, KeyLimit, NewEmit,
        PendingAck, Redelivery, ReleaseOrder, Released, RetryWrite, SessionId, Unrefreshed, ACK_CHUNK,
    },
    verdicts::{Gone, Refusal},
    window::{Stall, Window, STALL},
    IdMap,
};
use crate::{
    error::Error,
    id::{BrandedId, StreamId},
};

/// Deliveries a call lost to a peer or to deletion whose verdict may still
/// come, remembered per call; past it they are forgotten, and a late verdict
/// is answered UNKNOWN_ID.
const GONE_REMEMBERED: usize = 4096;
/// The longest a read waits for a worthwhile share of credit to come free
/// (see [`Ledger::read_now`]): a call with a free slot gets a new entry
/// within this, even from a client that holds the rest for good.
pub(crate) const READ_LINGER: Duration = Duration::from_millis(2);
/// Entries a group may hold waiting for their key, per entry of its calls'
/// credit: past it no new entries are read, the one case where other keys
/// wait (behind the waiting ones).
const KEY_WAITING_PER_CREDIT: usize = 4;
/// The fewest and the most entries a group holds waiting for their key
/// before it stops reading new ones (see [`Ledger::key_waiting_bound`]).
const KEY_WAITING_MIN: usize = 64;
pub(crate) const KEY_WAITING_MAX: usize = 10_000;
/// `--key-wait-poll-ms`'s default, until the worker sets the configured one.
pub(crate) use crate::config::consume::DEFAULT_KEY_WAIT_POLL;

/// What the ledger asks the worker to do outside it, in order.
#[derive(Debug)]
pub(crate) enum Effect<D> {
    /// Hand `out` to call `session`, as the delivery of `out.branded` from the
    /// call's shard `shard`. The ledger counts it held already: should the
    /// call be gone, the worker gives it back with [`Ledger::undelivered`].
    Deliver { session: SessionId, shard: usize, out: Outgoing<D> },
    /// Answer the call's verdict on `text` (the id as the client sent it),
    /// or tell it unasked (LEASE_LOST).
    Answer { session: SessionId, text: String, refusal: Refusal },
    /// Tell the call it no longer holds `id` from shard `shard` (its ack
    /// deadline passed, a peer took it, it was deleted; on a sharded call,
    /// also a verdict settled it): a sharded call's relay routes its later
    /// verdict there still, and hands over a namesake it parked. `settled`:
    /// by a verdict, so no later verdict on it needs that route.
    Left { session: SessionId, shard: usize, id: BrandedId, settled: bool },
    /// Answer call `session`'s AckEmit on `text` (the id as the client
    /// sent it): applied, its emits appended to `emitted` (stream key,
    /// stream id), in order.
    Emitted { session: SessionId, text: String, emitted: Vec<(String, StreamId)> },
    /// The delivery of `stream_id` left its call, settled by `verdict`
    /// (`ack`, `ack_emit`, `fail`, `dead_letter`) or by none: its span ends. Only on a
    /// ledger made `traced`.
    Ended { stream_id: StreamId, verdict: Option<&'static str> },
}

/// What the ledger counted since the worker last recorded it in the
/// group's metrics.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Deliveries handed to calls (`echomq_deliveries_total`).
    pub(crate) deliveries: u64,
    /// Deliveries failed: a Fail, a passed deadline, a call that ended
    /// holding them (`echomq_fails_total`).
    pub(crate) fails: u64,
    /// Of those, transient Fails, which cost no attempt (`echomq_transient_fails_total`).
    pub(crate) transient_fails: u64,
    /// Of those, poison Fails, dead-lettered at once (`echomq_poison_fails_total`).
    pub(crate) poison_fails: u64,
    /// Calls' adaptive windows that stalled (`echomq_window_stalls_total`).
    pub(crate) window_stalls: u64,
    /// Calls that stalled at their window's cap, each once, and the
    /// entries each held: the worker logs them.
    pub(crate) capped_calls: Vec<(SessionId, usize)>,
    /// Deliveries given back to the group by a Release, as Redis confirmed
    /// (`echomq_releases_total`).
    pub(crate) releases: u64,
    /// Held deliveries a peer took (`echomq_leases_lost_total`).
    pub(crate) leases_lost: u64,
    /// Acks Redis confirmed (`echomq_acks_total`).
    pub(crate) acks: u64,
    /// Acked ids Redis no longer had pending (`echomq_acks_not_pending_total`).
    pub(crate) acks_not_pending: u64,
    /// Entries AckEmits appended (`echomq_emits_total`).
    pub(crate) emits: u64,
    /// Entries moved to the dead-letter stream (`echomq_dead_letters_total`).
    pub(crate) dead_letters: u64,
    /// Leases refreshed (`echomq_lease_refreshes_total`).
    pub(crate) lease_refreshes: u64,
    /// Entries the reclaim beat took over (`echomq_reclaimed_total`).
    pub(crate) reclaimed: u64,
    /// Entries found deleted while pending (`echomq_trimmed_while_pending_total`).
    pub(crate) trimmed: u64,
    /// Seconds from hand-over to verdict, one per settled delivery.
    pub(crate) handler_seconds: Vec<f64>,
    /// Entries put through the per-key gate (`echomq_key_gate_checks_total`).
    pub(crate) key_gate_checks: u64,
}

/// A call's subscription settings, validated.
#[derive(Clone, Debug)]
pub(crate) struct Policy {
    /// Most entries the call holds un-settled (this worker's share of them
    /// on a sharded stream).
    pub(crate) max_in_flight: u32,
    /// The client set no `max_in_flight`: its window adapts up to
    /// `max_in_flight` (see [`Window`]) instead of being fixed there.
    pub(crate) adaptive: bool,
    /// How long a delivery may stay un-settled; `None`: as long as the call lives.
    pub(crate) ack_deadline: Option<Duration>,
    /// The retry delays after a Fail without `retry_after`, a passed
    /// deadline or a call that ended holding the delivery.
    pub(crate) backoff: Backoff,
    /// The call reads several shards: its relay routes each verdict to the
    /// shard that delivered, so it is told ([`Effect::Left`]) when a verdict
    /// settles a delivery too, rather than guessing which verdicts will.
    pub(crate) sharded: bool,
}

/// A Fail, its id parsed.
#[derive(Debug)]
pub(crate) struct FailVerdict {
    /// The id as the client sent it, for verdict errors.
    pub(crate) text: String,
    pub(crate) id: BrandedId,
    /// Overrides the subscription's backoff; `Err` says why the client's value
    /// is invalid (the verdict is then answered INVALID_ARGUMENT).
    pub(crate) retry_after: Result<Option<Duration>, String>,
    /// Whether it counts, or is dead-lettered now; `Err` says why the
    /// client's kind is invalid (answered INVALID_ARGUMENT).
    pub(crate) kind: Result<FailKind, String>,
    /// Kept as the entry's last failure reason.
    pub(crate) reason: String,
}

/// A delivery held by a call.
#[derive(Debug)]
struct Held {
    stream_id: StreamId,
    attempts: u32,
    deadline: Option<Instant>,
    /// When it was handed over, for the handler-time histogram.
    delivered_at: Instant,
    /// Its member in the group's keyed entries, removed with its XACK.
    member: Option<Vec<u8>>,
}

/// One call attached to this worker.
struct Call {
    /// This worker's stream's index among the call's shards.
    shard: usize,
    policy: Policy,
    /// How many entries it may hold now (at most `policy.max_in_flight`).
    window: Window,
    held: IdMap<BrandedId, Held>,
    /// Deliveries Redis took from this call, and why: their verdicts are
    /// answered NOT_PENDING until the id is delivered to the call again.
    gone: IdMap<BrandedId, Gone>,
    /// The call's receiver is gone (its detach is on the way), or the client
    /// asked to drain: it takes nothing more.
    closed: bool,
}

impl Call {
    fn free(&self) -> usize {
        if self.closed {
            return 0;
        }
        (self.window.size() as usize).saturating_sub(self.held.len())
    }

    /// The answer to a verdict on `id`, which this call does not hold.
    fn not_held(&self, id: &BrandedId) -> Refusal {
        match self.gone.get(id) {
            Some(gone) => Refusal::Gone(*gone),
            None => Refusal::UnknownId,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Track {
    Held(SessionId, BrandedId),
    Ready,
    Waiting(Instant),
    KeyWaiting,
}

/// Acks of one settle that Redis found partly not pending (another client
/// acknowledged some): XACK counts them, it does not say which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shortfall {
    /// The acks in the chunks that fell short.
    pub(crate) acked: usize,
    /// How many of those were no longer pending.
    pub(crate) not_pending: usize,
    /// The lowest and highest stream id among them.
    pub(crate) first: StreamId,
    pub(crate) last: StreamId,
}

/// The Redis writes the ledger's transitions call for, carried out by the
/// worker after each batch of commands.
#[derive(Debug, Default)]
pub(crate) struct Orders {
    /// XACKs (settle.lua).
    pub(crate) acks: Vec<PendingAck>,
    /// Retry states to record (settle.lua).
    pub(crate) retry_writes: Vec<RetryWrite>,
    /// Entries to move to the dead-letter stream (dead_letter.lua).
    pub(crate) dead_letters: Vec<DeadLetterOrder>,
    /// Deliveries to give back to the group (release.lua).
    pub(crate) releases: Vec<ReleaseOrder>,
    /// AckEmits (ack_emit.lua), each a script run of its own.
    pub(crate) emits: Vec<EmitOrder>,
}

/// The next Redis step of the worker's pump (see [`Ledger::next_work`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Work {
    /// Claim these due entries (`redeliver.lua`) and offer them.
    Redeliver(Vec<StreamId>),
    /// Read `count` ids of the own PEL after `after` (`None`: from the start).
    RecoverPage { after: Option<StreamId>, count: usize },
    /// Put these entries that wait for their key (stream id, member) through
    /// the gate (`keys_gate.lua`) and hand on those it lets through.
    KeyGate(Vec<(StreamId, Vec<u8>)>),
    /// Ask the reader for `count` new entries.
    Read(usize),
}

/// What [`Ledger::detach`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Detached {
    /// Deliveries the call held, now waiting for their backoff.
    pub(crate) returned: usize,
    /// No call is left: the worker stops reading.
    pub(crate) last: bool,
}

/// One group's bookkeeping, `D` the contents of a delivery. See the module doc.
pub(crate) struct Ledger<D> {
    stream: String,
    group: String,
    /// At-most-once: nothing is pending, verdicts only free credit.
    no_ack: bool,
    /// Shutdown: hand nothing out, keep taking verdicts.
    draining: bool,
    /// The group's settings, set by the first call and shared by the others.
    settings: Option<GroupPolicy>,
    /// Boxed: a map's first allocation holds room for four values, and most
    /// groups have one call.
    calls: HashMap<SessionId, Box<Call>>,
    entries: IdMap<StreamId, Track>,
    waiting: BTreeSet<(Instant, StreamId)>,
    ready: VecDeque<Outgoing<D>>,
    /// Entries held back by the per-key gate, by key.
    key_waits: KeyWaits<D>,
    /// Keys (member prefixes) with waiting entries that this sidecar's
    /// settling freed: put through the gate at once.
    keys_freed: Vec<Vec<u8>>,
    /// When the waiting entries are next put through the gate anyway (an
    /// entry of their key settled elsewhere, by a peer or an operator).
    next_key_poll: Option<Instant>,
    /// `--key-wait-poll-ms`.
    key_wait_poll: Duration,
    /// Entries asked of the reader and not yet returned (credit spoken for).
    read_outstanding: usize,
    /// Since when free credit has been too little to be worth a read.
    short_of_credit: Option<Instant>,
    /// No call out of credit stalls before this (see [`Window::stall_due`]);
    /// `None`: none can. A bound, not the instant: a call that runs out or
    /// sends a verdict out of credit moves it to at most [`STALL`] ahead,
    /// and [`Ledger::unstall`] puts it right once it passes.
    stall_check: Option<Instant>,
    /// While this consumer's own PEL is walked: the last id seen (`None`:
    /// from the start). New entries are read only after the walk.
    recovering: Option<Option<StreamId>>,
    /// Entries the walk under way found, for its end's log line.
    recovered: u64,
    orders: Orders,
    /// Frames and span ends for the worker, in order.
    effects: Vec<Effect<D>>,
    tally: Tally,
    /// Deliveries have spans (traces are exported): [`Effect::Ended`] is queued.
    traced: bool,
    /// The wall clock (unix milliseconds) at an instant, as the worker last
    /// read it: retry states in Redis are due at wall-clock times, and the
    /// ledger reads no clock of its own.
    wall_clock: (Instant, u64),
}

impl<D> Ledger<D> {
    /// An empty ledger for `group` on `stream`; `traced`: say when each
    /// delivery's span ends.
    pub(crate) fn new(stream: &str, group: &str, no_ack: bool, draining: bool, traced: bool) -> Ledger<D> {
        Ledger {
            stream: stream.to_owned(),
            group: group.to_owned(),
            no_ack,
            draining,
            settings: None,
            calls: HashMap::new(),
            entries: IdMap::default(),
            waiting: BTreeSet::new(),
            ready: VecDeque::new(),
            key_waits: KeyWaits::default(),
            keys_freed: Vec::new(),
            next_key_poll: None,
            key_wait_poll: DEFAULT_KEY_WAIT_POLL,
            read_outstanding: 0,
            short_of_credit: None,
            stall_check: None,
            // Nothing of an at-most-once reader is ever pending: nothing to recover.
            recovering: if no_ack { None } else { Some(None) },
            recovered: 0,
            orders: Orders::default(),
            effects: Vec::new(),
            tally: Tally::default(),
            traced,
            wall_clock: (Instant::now(), 0),
        }
    }

    /// Adds a call. The group's settings come from its first call; a later call
    /// that asks for others is refused (FAILED_PRECONDITION) rather than
    /// silently overruled.
    pub(crate) fn attach(
        &mut self,
        session: SessionId,
        shard: usize,
        policy: Policy,
        settings: GroupPolicy,
    ) -> Result<(), Error> {
        match &self.settings {
            Some(current) if *current != settings && !self.calls.is_empty() => {
                let keys = match &current.keys {
                    Some(limit) => format!("key_field `{}` and max_in_flight_per_key {}", limit.field, limit.per_key),
                    None => "no key_field".to_owned(),
                };
                return Err(Error::Conflict {
                    reason: format!(
                        "group `{}` on stream `{}` already runs on this sidecar with max_deliveries {}, dead-letter stream `{}` and {keys}; subscribe with the same settings",
                        self.group, self.stream, current.max_deliveries, current.dead_letter_stream
                    ),
                });
            }
            _ => self.settings = Some(settings),
        }
        let window =
            if policy.adaptive { Window::adaptive(policy.max_in_flight) } else { Window::fixed(policy.max_in_flight) };
        let call = Call { shard, policy, window, held: IdMap::default(), gone: IdMap::default(), closed: false };
        self.calls.insert(session, Box::new(call));
        Ok(())
    }

    /// A call ended: what it held waits for its backoff, as after a Fail.
    pub(crate) fn detach(&mut self, session: SessionId, now: Instant) -> Detached {
        let Some(call) = self.calls.remove(&session) else {
            return Detached { returned: 0, last: self.calls.is_empty() };
        };
        let returned = call.held.len();
        for held in call.held.into_values() {
            self.entries.remove(&held.stream_id);
            self.ended(held.stream_id, None);
            let delay = call.policy.backoff.delay(held.attempts);
            self.retry_later(held.stream_id, delay, "the call ended before a verdict".to_owned(), true, now);
        }
        let last = self.calls.is_empty();
        if last {
            self.release_ready(now);
        }
        Detached { returned, last }
    }

    /// The client is stopping: hand this call nothing more.
    pub(crate) fn drain_call(&mut self, session: SessionId) {
        if let Some(call) = self.calls.get_mut(&session) {
            call.closed = true;
        }
    }

    /// Whether any call is attached (open, or drained and not yet ended).
    pub(crate) fn has_calls(&self) -> bool {
        !self.calls.is_empty()
    }

    /// Whether any call still takes deliveries (attached, not drained, not closed).
    pub(crate) fn has_open_calls(&self) -> bool {
        self.calls.values().any(|call| !call.closed)
    }

    /// Shutdown began (or ended): while draining nothing is handed out.
    pub(crate) fn set_draining(&mut self, draining: bool) {
        self.draining = draining;
    }

    /// Whether shutdown began.
    pub(crate) fn draining(&self) -> bool {
        self.draining
    }

    /// The group's settings, once a call set them.
    pub(crate) fn settings(&self) -> Option<&GroupPolicy> {
        self.settings.as_ref()
    }

    /// Deliveries held by calls now (entries): the one count, derived.
    pub(crate) fn held(&self) -> usize {
        self.calls.values().map(|call| call.held.len()).sum()
    }

    /// Free slots of the calls (entries).
    fn slots(&self) -> usize {
        self.calls.values().map(|call| call.free()).sum()
    }

    /// Credit for due re-deliveries: the blocking read's share is not counted,
    /// or an idle stream's read would hold a due retry back for up to its
    /// BLOCK time. Entries that read then returns wait as ready, so memory
    /// stays bounded by twice the credit.
    pub(crate) fn free_for_due(&self) -> usize {
        self.slots().saturating_sub(self.ready.len())
    }

    /// Free credit: slots minus entries already on their way; none while
    /// the entries waiting for their key reach [`Ledger::key_waiting_bound`]
    /// (no new entries are read then, nor the own PEL walked on).
    pub(crate) fn free(&self) -> usize {
        // The bound is summed over the calls: only looked at while entries wait.
        if !self.key_waits.is_empty() && self.key_waits.len() >= self.key_waiting_bound() {
            return 0;
        }
        self.free_for_due().saturating_sub(self.read_outstanding)
    }

    /// The group's per-key limit, when it has one.
    pub(crate) fn key_limit(&self) -> Option<&KeyLimit> {
        self.settings.as_ref().and_then(|settings| settings.keys.as_ref())
    }

    /// How many entries may wait for their key before no new entries are
    /// read: [`KEY_WAITING_PER_CREDIT`] times the calls' `max_in_flight`,
    /// within [`KEY_WAITING_MIN`] and [`KEY_WAITING_MAX`]. A bound on
    /// what reads add: reclaims and retries still come in past it (one of
    /// them may be the entry a key waits for).
    pub(crate) fn key_waiting_bound(&self) -> usize {
        let credit: usize = self.calls.values().map(|call| call.policy.max_in_flight as usize).sum();
        (credit * KEY_WAITING_PER_CREDIT).clamp(KEY_WAITING_MIN, KEY_WAITING_MAX)
    }

    /// Entries waiting for their key now (`echomq_key_waiting_entries`).
    pub(crate) fn key_waiting(&self) -> usize {
        self.key_waits.len()
    }

    /// Sets `--key-wait-poll-ms`.
    pub(crate) fn set_key_wait_poll(&mut self, every: Duration) {
        self.key_wait_poll = every;
    }

    /// When waiting entries are next put through the gate, if any wait.
    pub(crate) fn key_poll_due(&self) -> Option<Instant> {
        if self.key_waits.is_empty() || self.free_for_due() == 0 {
            return None;
        }
        if !self.keys_freed.is_empty() {
            // Past: the pump takes them on its next turn.
            return Some(self.wall_clock.0);
        }
        self.next_key_poll
    }

    /// The entries to put through the gate now, at most `max`: each freed
    /// key's first waiting ones at once; every key's when the poll is due.
    /// None while no call has a free slot: what the gate lets through would
    /// only wait as ready.
    fn key_candidates(&mut self, now: Instant, max: usize) -> Option<Vec<(StreamId, Vec<u8>)>> {
        let per_key = self.key_limit()?.per_key;
        if self.key_waits.is_empty() {
            self.keys_freed.clear();
            self.next_key_poll = None;
            return None;
        }
        if self.free_for_due() == 0 {
            return None;
        }
        let candidates = if self.next_key_poll.is_none_or(|at| at <= now) {
            self.keys_freed.clear();
            self.next_key_poll = Some(now + self.key_wait_poll);
            self.key_waits.candidates(per_key, None, max)
        } else if !self.keys_freed.is_empty() {
            let freed = std::mem::take(&mut self.keys_freed);
            self.key_waits.candidates(per_key, Some(&freed), max)
        } else {
            return None;
        };
        (!candidates.is_empty()).then_some(candidates)
    }

    /// An entry the gate held back (its key is at its limit): it waits
    /// here, leased, until a later gate run lets it through. A re-created
    /// group may read again what a call holds: that call's verdict settles
    /// it. With no call at all, it waits in the PEL (for the next call, or
    /// a peer's reclaim), as a ready entry would.
    pub(crate) fn key_wait(&mut self, out: Outgoing<D>, now: Instant) {
        match self.entries.get(&out.stream_id) {
            Some(Track::Held(..)) => return,
            Some(Track::Ready) => self.ready.retain(|ready| ready.stream_id != out.stream_id),
            Some(Track::Waiting(at)) => {
                let at = *at;
                self.waiting.remove(&(at, out.stream_id));
            }
            Some(Track::KeyWaiting) | None => {}
        }
        if self.calls.is_empty() || out.member.is_none() {
            return self.wait(out.stream_id, now);
        }
        let stream_id = out.stream_id;
        if self.key_waits.insert(out).is_ok() {
            self.entries.insert(stream_id, Track::KeyWaiting);
            self.next_key_poll.get_or_insert(now + self.key_wait_poll);
        }
    }

    /// What the gate said of `candidates` (in order): the entries it let
    /// through are offered to the calls; those no longer this consumer's (a
    /// peer took them while this sidecar was paused, or they left the PEL)
    /// are forgotten, never handed out; the others go on waiting. Those that
    /// stopped waiting meanwhile are skipped.
    pub(crate) fn key_gated(&mut self, candidates: Vec<(StreamId, Vec<u8>)>, checked: &[Checked], now: Instant) {
        self.tally.key_gate_checks += candidates.len() as u64;
        for ((stream_id, _), &checked) in candidates.into_iter().zip(checked) {
            if checked == Checked::Waits || self.entries.get(&stream_id) != Some(&Track::KeyWaiting) {
                continue;
            }
            if checked == Checked::Gone {
                self.forget(stream_id, Gone::ToPeer);
                continue;
            }
            if let Some(out) = self.key_waits.remove(stream_id) {
                self.entries.remove(&stream_id);
                self.offer(out, now);
            }
        }
    }

    /// Counts entries the read script put through the gate.
    pub(crate) fn key_gate_checked(&mut self, entries: usize) {
        self.tally.key_gate_checks += entries as u64;
    }

    /// An entry of the key with member `member` left the PEL (acknowledged,
    /// emitted) or may have: its waiting entries go through the gate at once.
    fn key_freed(&mut self, member: &[u8]) {
        let key = keyed::prefix(member);
        if self.key_waits.has_key(key) && !self.keys_freed.iter().any(|freed| freed == key) {
            self.keys_freed.push(key.to_vec());
        }
    }

    /// How many entries the reclaim beat may take: slots not yet spoken for
    /// by entries on hand. The blocking read usually holds all free credit, so
    /// it is left out: entries taken now are handed out as soon as that read
    /// returns (BLOCK bounds the wait), and memory stays bounded by twice the
    /// credit.
    pub(crate) fn reclaim_room(&self) -> usize {
        self.slots().saturating_sub(self.ready.len() + self.waiting.len())
    }

    /// The fewest free slots worth a read of new entries. With deliveries
    /// out, a quarter of the calls' credit (at most `max`), so a slow client
    /// whose acks free one slot at a time does not cost one XREADGROUP per
    /// slot; with none out, one: the stream is idle and a read costs nothing
    /// while it blocks, and waiting would add latency.
    fn worth_reading(&self, max: usize) -> usize {
        if self.held() + self.ready.len() == 0 {
            return 1;
        }
        let credit: usize = self.calls.values().filter(|c| !c.closed).map(|c| c.window.size() as usize).sum();
        (credit / 4).clamp(1, max.max(1))
    }

    /// The one decision to read new entries: how many to ask for now (at
    /// most `max`), or `None`. No read while one is under way or without
    /// free credit; with free credit, a read once it is worth it (see
    /// [`Ledger::worth_reading`]: at once with nothing out, else a quarter
    /// of the credit) or [`READ_LINGER`] after the first slot came free,
    /// whichever is first. [`Ledger::read_due`] says when to ask again.
    pub(crate) fn read_now(&mut self, now: Instant, max: usize) -> Option<usize> {
        if self.is_reading() {
            return None;
        }
        let count = self.free().min(max);
        if count == 0 {
            self.short_of_credit = None;
            return None;
        }
        let lingered = self.short_of_credit.is_some_and(|since| now >= since + READ_LINGER);
        if count >= self.worth_reading(max) || lingered {
            self.short_of_credit = None;
            return Some(count);
        }
        self.short_of_credit.get_or_insert(now);
        None
    }

    /// What the worker does next with Redis while it may, in this order:
    /// claim the due entries for re-delivery (at most `max`, within credit),
    /// walk the next page of the own PEL, read new entries (see
    /// [`Ledger::read_now`]); `None` when none is due. Taking due entries
    /// moves them out of the waiting set: the worker offers what it claims
    /// and puts back ([`Ledger::wait`]) what it could not.
    pub(crate) fn next_work(&mut self, now: Instant, max: usize) -> Option<Work> {
        let due = self.take_due(now, max);
        if !due.is_empty() {
            return Some(Work::Redeliver(due));
        }
        if let Some(candidates) = self.key_candidates(now, max) {
            return Some(Work::KeyGate(candidates));
        }
        if let Some(after) = self.recovering {
            let count = self.free().min(max);
            return (count > 0).then_some(Work::RecoverPage { after, count });
        }
        self.read_now(now, max).map(Work::Read)
    }

    /// Walks the own PEL again before the next new read (unless a walk is
    /// under way, or at most once, where nothing is pending): after a read's
    /// reply was lost (Redis may have run it) and after a primary switch.
    /// Returns whether a walk started.
    pub(crate) fn recover_own_pending(&mut self) -> bool {
        if self.no_ack || self.recovering.is_some() {
            return false;
        }
        self.recovering = Some(None);
        true
    }

    /// One page of the own PEL (`ids`, in stream order, of `asked`) waits
    /// for re-delivery. A short page ends the walk: returns how many
    /// entries the whole walk found new, for its log line.
    pub(crate) fn recovered_page(&mut self, ids: &[StreamId], asked: usize, now: Instant) -> Option<u64> {
        self.recovered += self.found_pending(ids, now);
        if ids.len() < asked {
            self.recovering = None;
            return Some(std::mem::take(&mut self.recovered));
        }
        if let (Some(after), Some(&last)) = (self.recovering.as_mut(), ids.last()) {
            *after = Some(last);
        }
        None
    }

    /// When a read held back for too little free credit is due anyway.
    pub(crate) fn read_due(&self) -> Option<Instant> {
        self.short_of_credit.map(|since| since + READ_LINGER)
    }

    /// The wall clock reads `unix_ms` at `at` (the worker tells it before
    /// each transition that may record a retry state).
    pub(crate) fn set_wall_clock(&mut self, at: Instant, unix_ms: u64) {
        self.wall_clock = (at, unix_ms);
    }

    /// The wall clock at `now`, from the last reading.
    fn unix_ms(&self, now: Instant) -> u64 {
        let (at, unix_ms) = self.wall_clock;
        unix_ms.saturating_add(now.saturating_duration_since(at).as_millis() as u64)
    }

    /// A read of `count` new entries was asked of the reader.
    pub(crate) fn reading(&mut self, count: usize) {
        self.read_outstanding = count;
    }

    /// The read returned (or was cut off).
    pub(crate) fn read_done(&mut self) {
        self.read_outstanding = 0;
    }

    /// Whether a read is under way.
    pub(crate) fn is_reading(&self) -> bool {
        self.read_outstanding > 0
    }

    /// Whether the worker tracks `stream_id` in any state.
    pub(crate) fn tracks(&self, stream_id: StreamId) -> bool {
        self.entries.contains_key(&stream_id)
    }

    /// Puts `stream_id` in the waiting set, due at `at` (moving it if it waits already).
    pub(crate) fn wait(&mut self, stream_id: StreamId, at: Instant) {
        if let Some(Track::Waiting(old)) = self.entries.insert(stream_id, Track::Waiting(at)) {
            self.waiting.remove(&(old, stream_id));
        }
        self.waiting.insert((at, stream_id));
    }

    /// The earliest instant an entry is due, if any waits.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.waiting.first().map(|(at, _)| *at)
    }

    /// Takes the entries due by `now`, at most `max` and no more than there is
    /// credit for, out of the waiting set, for the worker to claim; it puts
    /// back ([`Ledger::wait`]) or offers what it claimed.
    pub(crate) fn take_due(&mut self, now: Instant, max: usize) -> Vec<StreamId> {
        let due: Vec<(Instant, StreamId)> =
            self.waiting.iter().take_while(|(at, _)| *at <= now).take(self.free_for_due().min(max)).copied().collect();
        for key in &due {
            self.waiting.remove(key);
            self.entries.remove(&key.1);
        }
        due.into_iter().map(|(_, id)| id).collect()
    }

    /// An entry read or claimed from Redis, its delivery counted: handed to a
    /// call now, else kept ready for the next free slot; with no call at all,
    /// it waits in the PEL. A re-created group (after NOGROUP) reads again
    /// what a call still holds: that call's verdict settles it, it is not
    /// handed out twice. While draining nothing is handed out: a read that
    /// was under way leaves its entries ready, pending for the next run or a peer.
    pub(crate) fn offer(&mut self, out: Outgoing<D>, now: Instant) {
        match self.entries.get(&out.stream_id) {
            Some(Track::Held(..)) => return,
            Some(Track::KeyWaiting) => {
                self.key_waits.remove(out.stream_id);
                self.entries.remove(&out.stream_id);
            }
            _ => {}
        }
        let out = if self.draining { Some(out) } else { self.hand_out(out, now) };
        if let Some(out) = out {
            self.keep_ready(out, now);
        }
    }

    /// Hands ready entries to calls with free credit, in arrival order.
    pub(crate) fn hand_out_ready(&mut self, now: Instant) {
        self.unstall(now);
        while let Some(out) = self.ready.pop_front() {
            if let Some(out) = self.hand_out(out, now) {
                self.ready.push_front(out);
                break;
            }
        }
    }

    /// Calls out of credit that sent no verdict for their window's patience
    /// wait for more than it allows (see [`Window::stalled`]): their windows
    /// open up. A call stalled at its cap is told to the worker
    /// ([`Tally::capped_calls`]), which logs it.
    fn unstall(&mut self, now: Instant) {
        if self.stall_check.is_none_or(|at| at > now) {
            return;
        }
        let mut next = None;
        for (session, call) in self.calls.iter_mut() {
            if call.free() > 0 || call.closed {
                continue;
            }
            let Some(mut due) = call.window.stall_due() else { continue };
            if due <= now {
                let held = call.held.len();
                self.tally.window_stalls += 1;
                if call.window.stalled(held as u32, now) == Stall::AtCap {
                    self.tally.capped_calls.push((*session, held));
                }
                match call.window.stall_due() {
                    Some(later) if call.free() == 0 => due = later,
                    _ => continue,
                }
            }
            next = Some(next.map_or(due, |next: Instant| next.min(due)));
        }
        self.stall_check = next;
    }

    /// A call out of credit at `now` may stall from [`STALL`] on.
    fn may_stall(&mut self, now: Instant) {
        let at = now + STALL;
        self.stall_check = Some(self.stall_check.map_or(at, |check| check.min(at)));
    }

    /// When a call out of credit may count as stalled (see
    /// [`Ledger::hand_out_ready`]), if any can: never later than the
    /// earliest, perhaps sooner.
    pub(crate) fn stall_due(&self) -> Option<Instant> {
        self.stall_check
    }

    /// With no call left, entries read for a call that went away stop being
    /// leased: they wait in the PEL like any other, so a peer with clients can
    /// reclaim them after the minimum idle time instead of this idle sidecar
    /// sitting on them. If a call comes back first, they are claimed again
    /// (which checks they are still this consumer's).
    fn release_ready(&mut self, now: Instant) {
        let mut unstarted: Vec<StreamId> = self.ready.drain(..).map(|out| out.stream_id).collect();
        unstarted.extend(self.key_waits.drain().map(|out| out.stream_id));
        for stream_id in unstarted {
            self.wait(stream_id, now);
            // No handler saw it: it goes back with the delivery count it had
            // before this sidecar took it, as a client's Release does, so a
            // consumer that reconnects (a rolling restart) costs it no
            // attempt, and an entry that only waited for its key is never
            // dead-lettered for the waiting.
            if !self.no_ack {
                self.orders.releases.push(ReleaseOrder { stream_id, answer: None });
            }
        }
        self.keys_freed.clear();
        self.next_key_poll = None;
    }

    fn keep_ready(&mut self, out: Outgoing<D>, now: Instant) {
        if self.calls.is_empty() {
            return self.wait(out.stream_id, now);
        }
        self.entries.insert(out.stream_id, Track::Ready);
        self.ready.push_back(out);
    }

    /// Hands one entry to the call with the most free credit that does not
    /// already hold an entry with the same branded id (so a verdict by branded
    /// id is never ambiguous). Gives the entry back when no call can take it.
    fn hand_out(&mut self, out: Outgoing<D>, now: Instant) -> Option<Outgoing<D>> {
        let target = self
            .calls
            .iter()
            .filter(|(_, call)| call.free() > 0 && !call.held.contains_key(&out.branded))
            .max_by_key(|(_, call)| call.free())
            .map(|(id, _)| *id);
        let Some(session) = target else { return Some(out) };
        let call = self.calls.get_mut(&session).expect("picked from the map");
        let (stream_id, branded, attempts) = (out.stream_id, out.branded, out.attempts);
        call.gone.remove(&branded);
        let deadline = call.policy.ack_deadline.map(|d| now + d);
        let member = out.member.clone();
        call.held.insert(branded, Held { stream_id, attempts, deadline, delivered_at: now, member });
        let ran_out = call.free() == 0;
        if ran_out {
            call.window.ran_out(now);
        }
        let can_stall = ran_out && call.window.is_adaptive();
        self.effects.push(Effect::Deliver { session, shard: call.shard, out });
        self.entries.insert(stream_id, Track::Held(session, branded));
        self.tally.deliveries += 1;
        if can_stall {
            self.may_stall(now);
        }
        None
    }

    /// The worker could not hand `out` to call `session` (its receiver is
    /// gone; its detach is on the way): the call is closed, takes nothing
    /// more, and the entry is first in line for another call.
    pub(crate) fn undelivered(&mut self, session: SessionId, out: Outgoing<D>, now: Instant) {
        if let Some(call) = self.calls.get_mut(&session) {
            call.closed = true;
            if call.held.remove(&out.branded).is_some() {
                self.entries.remove(&out.stream_id);
                self.tally.deliveries = self.tally.deliveries.saturating_sub(1);
            }
        }
        if self.calls.is_empty() {
            return self.wait(out.stream_id, now);
        }
        self.entries.insert(out.stream_id, Track::Ready);
        self.ready.push_front(out);
    }

    /// Schedules a failed entry's re-delivery after `delay`, here and, through
    /// the group's retry hash, for a peer that reclaims it or for this sidecar
    /// after a restart.
    /// `counts`: the failure counts as an attempt (all but a transient Fail).
    fn retry_later(&mut self, stream_id: StreamId, delay: Duration, reason: String, counts: bool, now: Instant) {
        if self.no_ack {
            return;
        }
        self.tally.fails += 1;
        self.tally.transient_fails += u64::from(!counts);
        self.wait(stream_id, now + delay);
        let due_unix_ms = self.unix_ms(now).saturating_add(delay.as_millis() as u64);
        self.orders.retry_writes.push(RetryWrite { stream_id, due_unix_ms, reason, counts });
    }

    /// Takes the delivery `id` out of the call's hands; answers the verdict
    /// itself when the call does not hold it. `handled`: a handler ran it (an
    /// Ack or a Fail), so its time until the verdict is a handler time, for
    /// the window and the histogram; a released delivery's is not.
    fn settle(&mut self, session: SessionId, text: &str, id: BrandedId, now: Instant, handled: bool) -> Option<Held> {
        let call = self.calls.get_mut(&session)?;
        let Some(held) = call.held.remove(&id) else {
            let refusal = call.not_held(&id);
            self.effects.push(Effect::Answer { session, text: text.to_owned(), refusal });
            return None;
        };
        if call.policy.sharded {
            self.effects.push(Effect::Left { session, shard: call.shard, id, settled: true });
        }
        if handled {
            let latency = now.saturating_duration_since(held.delivered_at);
            call.window.verdict(held.delivered_at, now);
            // A window that shrank under the call leaves it out of credit.
            let can_stall = call.free() == 0 && call.window.is_adaptive();
            self.tally.handler_seconds.push(latency.as_secs_f64());
            if can_stall {
                self.may_stall(now);
            }
        }
        self.entries.remove(&held.stream_id);
        Some(held)
    }

    /// The delivery of `stream_id` left its call (see [`Effect::Ended`]).
    fn ended(&mut self, stream_id: StreamId, verdict: Option<&'static str>) {
        if self.traced {
            self.effects.push(Effect::Ended { stream_id, verdict });
        }
    }

    /// Queues an answer to call `session`'s verdict on `text`.
    fn refuse(&mut self, session: SessionId, text: String, refusal: Refusal) {
        self.effects.push(Effect::Answer { session, text, refusal });
    }

    /// The Acks of one message: see [`Ledger::ack`].
    pub(crate) fn ack_all(&mut self, session: SessionId, ids: Vec<(String, BrandedId)>, now: Instant) {
        // Room for all at once: grown one ack at a time, the queue of a
        // flush reallocated at every power of two.
        if !self.no_ack {
            self.orders.acks.reserve(ids.len());
        }
        for (text, id) in ids {
            self.ack(session, text, id, now);
        }
    }

    /// An Ack: queues the XACK (none in at-most-once mode, where the entry is
    /// not pending); UNKNOWN_ID or NOT_PENDING when the call does not hold `id`.
    pub(crate) fn ack(&mut self, session: SessionId, text: String, id: BrandedId, now: Instant) {
        let Some(held) = self.settle(session, &text, id, now, true) else { return };
        self.ended(held.stream_id, Some("ack"));
        if !self.no_ack {
            let redelivered = held.attempts > 1;
            let member = held.member;
            self.orders.acks.push(PendingAck { session, text, stream_id: held.stream_id, redelivered, member });
        }
    }

    /// An AckEmit: queues the step that appends `emits` and acknowledges the
    /// entry, which `ack_emit.lua` applies only while Redis still has the
    /// entry pending for this consumer. UNKNOWN_ID or NOT_PENDING when the
    /// call does not hold `id`, as for an Ack; INVALID_ARGUMENT on an
    /// at-most-once subscription (nothing is pending to fence on; the
    /// delivery stays held). The delivery leaves the call now: the answer
    /// ([`Ledger::emitted`]) is `Emitted` or a verdict error.
    pub(crate) fn ack_emit(
        &mut self,
        session: SessionId,
        text: String,
        id: BrandedId,
        emits: Vec<NewEmit>,
        now: Instant,
    ) {
        let Some(call) = self.calls.get(&session) else { return };
        if self.no_ack && call.held.contains_key(&id) {
            let reason = "this is an at-most-once (no_ack) subscription: the entry is not pending, so nothing fences an AckEmit; ack it and append the emits";
            return self.refuse(session, text, Refusal::Invalid(reason.to_owned()));
        }
        let backoff = call.policy.backoff;
        let Some(held) = self.settle(session, &text, id, now, true) else { return };
        self.ended(held.stream_id, Some("ack_emit"));
        let (stream_id, attempts, member) = (held.stream_id, held.attempts, held.member);
        self.orders.emits.push(EmitOrder { session, text, stream_id, emits, attempts, backoff, member });
    }

    /// Redis refused `order`'s step before writing anything (a key of
    /// another type: `reason` says which): the AckEmit is answered
    /// INVALID_ARGUMENT, and the entry, still pending, is retried as after a
    /// Fail with that reason (so a stream that stays wrong ends in the
    /// dead-letter stream after `max_deliveries`, not in a hot loop).
    pub(crate) fn emit_refused(&mut self, order: EmitOrder, reason: String, now: Instant) {
        let EmitOrder { session, text, stream_id, attempts, backoff, .. } = order;
        let message = format!("{reason}; nothing was written or acknowledged, and the entry will be delivered again");
        self.answer(session, text, Refusal::Invalid(message));
        self.retry_later(stream_id, backoff.delay(attempts), format!("AckEmit refused: {reason}"), true, now);
    }

    /// What `ack_emit.lua` did with `order`: applied, the call is answered
    /// `Emitted` (and told UNAVAILABLE instead when the wait for replicas
    /// fell short, naming the ids written); not pending, NOT_PENDING; a
    /// peer's, LEASE_LOST. Nothing was written but on `Emitted`.
    pub(crate) fn emitted(&mut self, order: EmitOrder, outcome: Emission) {
        let EmitOrder { session, text, stream_id, emits, member, .. } = order;
        if let Some(member) = &member {
            self.key_freed(member);
        }
        match outcome {
            Emission::NotPending => {
                self.tally.acks_not_pending += 1;
                self.answer(session, text, Refusal::NotPendingInGroup);
            }
            Emission::NotOurs => {
                self.tally.leases_lost += 1;
                tracing::warn!(stream = %self.stream, group = %self.group, %stream_id, "AckEmit not applied: a peer reclaimed the entry; nothing was written");
                self.answer(session, text, Refusal::LeaseLost);
            }
            Emission::Emitted { ids, unconfirmed } => {
                self.tally.acks += 1;
                self.tally.emits += ids.len() as u64;
                let emitted: Vec<(String, StreamId)> = emits.into_iter().map(|emit| emit.stream).zip(ids).collect();
                match unconfirmed {
                    None => {
                        if self.calls.contains_key(&session) {
                            self.effects.push(Effect::Emitted { session, text, emitted });
                        }
                    }
                    Some(shortfall) => {
                        let written: Vec<String> = emitted
                            .iter()
                            .map(|(stream, id)| {
                                format!(
                                    "{} (stream id {id}) in `{stream}`",
                                    BrandedId::from_stream_id(*id).map(|b| b.to_string()).unwrap_or_default()
                                )
                            })
                            .collect();
                        let message = format!(
                            "the entry was acknowledged and its emits written to the primary ({}), but not confirmed: {shortfall}; a failover may lose the step, and the entry is then delivered again",
                            if written.is_empty() { "none".to_owned() } else { written.join(", ") }
                        );
                        self.answer(session, text, Refusal::Unavailable(message));
                    }
                }
            }
        }
    }

    /// A Fail: the entry waits for its retry delay (the client's
    /// `retry_after`, else the backoff), or is queued for the dead-letter
    /// stream. Answered, in this order: NOT_PENDING for a delivery Redis took
    /// away; INVALID_ARGUMENT for a bad `retry_after` or on an at-most-once
    /// subscription (the delivery stays held); UNKNOWN_ID when not held.
    pub(crate) fn fail(&mut self, session: SessionId, fail: FailVerdict, now: Instant) {
        let FailVerdict { text, id, retry_after, kind, reason } = fail;
        let Some(call) = self.calls.get(&session) else { return };
        if let Some(gone) = call.gone.get(&id) {
            let refusal = Refusal::Gone(*gone);
            return self.refuse(session, text, refusal);
        }
        let (retry_after, kind) = match (retry_after, kind) {
            (Ok(retry_after), Ok(kind)) => (retry_after, kind),
            (Err(reason), _) | (_, Err(reason)) => {
                let message = format!("{reason}; nothing was applied (a delivery this call holds stays held)");
                return self.refuse(session, text, Refusal::Invalid(message));
            }
        };
        if self.no_ack {
            return self.refuse(session, text, Refusal::FailWithoutPel);
        }
        let backoff = call.policy.backoff;
        let Some(held) = self.settle(session, &text, id, now, true) else { return };
        let verdict = match kind {
            FailKind::Message => "fail",
            FailKind::Transient => "fail_transient",
            FailKind::Poison => "dead_letter",
        };
        self.ended(held.stream_id, Some(verdict));
        if kind == FailKind::Poison {
            self.tally.fails += 1;
            self.tally.poison_fails += 1;
            let reason =
                if reason.is_empty() { "dead-lettered by the client (no reason given)".to_owned() } else { reason };
            let order = DeadLetterOrder { stream_id: held.stream_id, reason, verdict: Some((session, text)) };
            return self.orders.dead_letters.push(order);
        }
        let delay = retry_after.unwrap_or_else(|| backoff.delay(held.attempts));
        tracing::debug!(stream = %self.stream, stream_id = %held.stream_id, ?delay, ?kind, %reason, "delivery failed; retrying after the delay");
        self.retry_later(held.stream_id, delay, reason, kind == FailKind::Message, now);
    }

    /// A Release: the call gives back deliveries it never started. Each
    /// leaves the call now (its slot is free, a later verdict on it is
    /// UNKNOWN_ID) and is queued for `release.lua`, which gives it back to
    /// the group with its delivery count restored; [`Ledger::released`]
    /// takes the outcome. Answered, per id: NOT_PENDING for a delivery Redis
    /// took away; INVALID_ARGUMENT on an at-most-once subscription (the
    /// delivery stays held); UNKNOWN_ID when not held. Nothing is applied for
    /// an answered id.
    pub(crate) fn release(&mut self, session: SessionId, ids: Vec<(String, BrandedId)>, now: Instant) {
        for (text, id) in ids {
            let Some(call) = self.calls.get(&session) else { return };
            if let Some(gone) = call.gone.get(&id) {
                let refusal = Refusal::Gone(*gone);
                self.refuse(session, text, refusal);
                continue;
            }
            if self.no_ack {
                self.refuse(session, text, Refusal::ReleaseWithoutPel);
                continue;
            }
            let Some(held) = self.settle(session, &text, id, now, false) else { continue };
            self.ended(held.stream_id, Some("release"));
            self.orders.releases.push(ReleaseOrder { stream_id: held.stream_id, answer: Some((session, text)) });
        }
    }

    /// What `release.lua` did with each of `orders`: a released entry waits
    /// here due now, for this sidecar's other calls of the group (whose
    /// claim checks it is still this consumer's: a peer's reclaim beat may
    /// take it first); the Release of one that was not released is told why
    /// (a peer took it, or it was deleted).
    pub(crate) fn released(&mut self, orders: Vec<ReleaseOrder>, outcomes: Vec<(StreamId, Released)>, now: Instant) {
        for ((stream_id, outcome), order) in outcomes.into_iter().zip(orders) {
            let refusal = match outcome {
                Released::GivenBack { deliveries } => {
                    tracing::debug!(stream = %self.stream, group = %self.group, %stream_id, deliveries, "released to the group");
                    if order.answer.is_some() {
                        self.tally.releases += 1;
                    }
                    if !self.tracks(stream_id) {
                        self.wait(stream_id, now);
                    }
                    continue;
                }
                Released::NotOurs => {
                    self.forget(stream_id, Gone::ToPeer);
                    Refusal::NotReleased
                }
                Released::Deleted => {
                    self.trimmed(stream_id);
                    Refusal::Gone(Gone::Deleted)
                }
            };
            if let Some((session, text)) = order.answer {
                self.answer(session, text, refusal);
            }
        }
    }

    /// An Extend: pushes the ack deadline of each held id to `now + by` (no
    /// effect on a subscription without deadlines); UNKNOWN_ID or NOT_PENDING
    /// for the others.
    pub(crate) fn extend(&mut self, session: SessionId, ids: Vec<(String, BrandedId)>, by: Duration, now: Instant) {
        let Some(call) = self.calls.get_mut(&session) else { return };
        for (text, id) in ids {
            match call.held.get_mut(&id) {
                Some(held) => held.deadline = call.policy.ack_deadline.map(|_| now + by),
                None => self.effects.push(Effect::Answer { session, refusal: call.not_held(&id), text }),
            }
        }
    }

    /// Whether a held delivery may pass an ack deadline (cheap: per call,
    /// not per delivery; checked on every turn of the worker's loop).
    pub(crate) fn has_deadlines(&self) -> bool {
        self.calls.values().any(|call| call.policy.ack_deadline.is_some() && !call.held.is_empty())
    }

    /// Deliveries past their ack deadline are treated as failed: they leave
    /// their call (told by [`Effect::Left`]; a later verdict is UNKNOWN_ID)
    /// and wait for their backoff. Returns how many expired.
    pub(crate) fn expire(&mut self, now: Instant) -> usize {
        let mut expired = Vec::new();
        for (&session, call) in self.calls.iter_mut() {
            let ids: Vec<BrandedId> =
                call.held.iter().filter(|(_, h)| h.deadline.is_some_and(|d| d <= now)).map(|(id, _)| *id).collect();
            for id in ids {
                let held = call.held.remove(&id).expect("listed above");
                expired.push((held.stream_id, call.policy.backoff.delay(held.attempts)));
                self.effects.push(Effect::Left { session, shard: call.shard, id, settled: false });
            }
        }
        for &(stream_id, delay) in &expired {
            tracing::debug!(stream = %self.stream, %stream_id, "ack deadline passed; treated as failed");
            self.entries.remove(&stream_id);
            self.ended(stream_id, None);
            self.retry_later(stream_id, delay, "the ack deadline passed".to_owned(), true, now);
        }
        expired.len()
    }

    /// Stops tracking an entry Redis no longer has pending for this sidecar.
    /// A held one leaves its call (freeing its slot; the call is told by
    /// [`Effect::Left`], and its later verdicts are answered NOT_PENDING,
    /// saying `gone`); returns that call and the delivery's id.
    pub(crate) fn forget(&mut self, stream_id: StreamId, gone: Gone) -> Option<(SessionId, BrandedId)> {
        match self.entries.remove(&stream_id)? {
            Track::Held(session, id) => {
                let call = self.calls.get_mut(&session)?;
                call.held.remove(&id);
                if call.gone.len() >= GONE_REMEMBERED {
                    call.gone.clear();
                }
                call.gone.insert(id, gone);
                self.effects.push(Effect::Left { session, shard: call.shard, id, settled: false });
                self.ended(stream_id, None);
                Some((session, id))
            }
            Track::Ready => {
                self.ready.retain(|out| out.stream_id != stream_id);
                None
            }
            Track::Waiting(at) => {
                self.waiting.remove(&(at, stream_id));
                None
            }
            Track::KeyWaiting => {
                self.key_waits.remove(stream_id);
                None
            }
        }
    }

    /// A peer took an entry this sidecar holds: the call is told now
    /// (LEASE_LOST), and its later verdict is answered NOT_PENDING instead of
    /// being applied. Returns whether a call held it.
    pub(crate) fn lease_lost(&mut self, stream_id: StreamId) -> bool {
        let Some((session, id)) = self.forget(stream_id, Gone::ToPeer) else { return false };
        self.tally.leases_lost += 1;
        self.refuse(session, id.to_string(), Refusal::LeaseLost);
        true
    }

    /// The entries whose lease the worker keeps fresh: held, ready and
    /// key-waiting ones (so no peer's reclaim takes an entry that waits here
    /// for its key: it keeps its place in the key's order).
    pub(crate) fn leased(&self) -> Vec<StreamId> {
        self.entries
            .iter()
            .filter(|(_, track)| matches!(track, Track::Held(..) | Track::Ready | Track::KeyWaiting))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The entry was deleted from the stream and Redis dropped it from the
    /// PEL (XAUTOCLAIM's deleted ids, a nil body in a PEL read, a script's
    /// `deleted`): never forwarded, and if a call holds it, its verdict is
    /// answered NOT_PENDING.
    pub(crate) fn trimmed(&mut self, stream_id: StreamId) {
        self.forget(stream_id, Gone::Deleted);
        self.tally.trimmed += 1;
        tracing::debug!(stream = %self.stream, group = %self.group, %stream_id, "entry was deleted from the stream while pending");
    }

    /// Entries Redis has pending for this consumer (a page of its own PEL,
    /// or taken over by the reclaim beat) wait for re-delivery now, unless
    /// the ledger tracks them already. Returns how many were new to it.
    pub(crate) fn found_pending(&mut self, ids: &[StreamId], now: Instant) -> u64 {
        let mut found = 0;
        for &id in ids {
            if !self.tracks(id) {
                self.wait(id, now);
                found += 1;
            }
        }
        found
    }

    /// The reply of one XAUTOCLAIM page: the entries it took wait for
    /// re-delivery, the deleted ones are dropped. Returns how many it took.
    pub(crate) fn reclaimed(&mut self, claimed: &[StreamId], deleted: &[StreamId], now: Instant) -> u64 {
        let taken = self.found_pending(claimed, now);
        for &id in deleted {
            self.trimmed(id);
        }
        self.tally.reclaimed += taken;
        taken
    }

    /// What `redeliver.lua` did with a due entry, but for a claimed one
    /// (which the worker offers): a deleted one is dropped, an early one
    /// waits until its recorded due time (`now_unix_ms` the wall clock of
    /// `now`), a poison one is returned for the dead-letter step.
    pub(crate) fn redelivered(
        &mut self,
        stream_id: StreamId,
        outcome: Redelivery,
        now: Instant,
        now_unix_ms: u64,
    ) -> Option<DeadLetterOrder> {
        match outcome {
            Redelivery::NotOurs => {
                tracing::debug!(stream = %self.stream, %stream_id, "no longer pending for this consumer; a peer took it")
            }
            Redelivery::Deleted => self.trimmed(stream_id),
            Redelivery::NotDue { due_unix_ms } => {
                self.wait(stream_id, now + Duration::from_millis(due_unix_ms.saturating_sub(now_unix_ms)))
            }
            Redelivery::Poison { deliveries, reason } => {
                tracing::debug!(stream = %self.stream, %stream_id, deliveries, "max deliveries reached");
                let reason = if reason.is_empty() { "max deliveries reached".to_owned() } else { reason };
                return Some(DeadLetterOrder { stream_id, reason, verdict: None });
            }
            Redelivery::Claimed { .. } => debug_assert!(false, "a claimed entry is offered, not passed here"),
        }
        None
    }

    /// The leases of `asked` entries were refreshed but for `unrefreshed`:
    /// a deleted entry is dropped, one a peer took leaves its call
    /// (LEASE_LOST), one pending for no consumer stays (a re-created group
    /// reads it again and the call's verdict then applies, or another client
    /// acknowledged it and the verdict is answered NOT_PENDING).
    pub(crate) fn refreshed(&mut self, asked: usize, unrefreshed: Vec<(StreamId, Unrefreshed)>) {
        self.tally.lease_refreshes += asked.saturating_sub(unrefreshed.len()) as u64;
        for (stream_id, why) in unrefreshed {
            match why {
                Unrefreshed::Deleted => self.trimmed(stream_id),
                Unrefreshed::ToPeer => {
                    if self.lease_lost(stream_id) {
                        tracing::warn!(stream = %self.stream, group = %self.group, %stream_id, "lease lost: the entry is no longer pending for this consumer");
                    }
                }
                Unrefreshed::Unowned => {
                    tracing::debug!(stream = %self.stream, group = %self.group, %stream_id, "held entry is pending for no consumer")
                }
            }
        }
    }

    /// One settle's reply: per chunk of `acks` ([`ACK_CHUNK`] ids), how
    /// many of its ids Redis still had pending. All or none is exact: the
    /// ones not pending are answered NOT_PENDING. In between (another client
    /// acknowledged some of them: an operator, or a peer past a lost lease)
    /// XACK cannot say which, so none is answered: the shortfall is counted
    /// and returned, for the worker to log. Every id of the chunk is settled
    /// for the group either way.
    pub(crate) fn acked(&mut self, acks: Vec<PendingAck>, pending: &[usize]) -> Option<Shortfall> {
        for member in acks.iter().filter_map(|ack| ack.member.as_deref()) {
            self.key_freed(member);
        }
        let mut shortfall: Option<Shortfall> = None;
        let mut acks = acks.into_iter();
        for &pending in pending {
            let chunk: Vec<PendingAck> = acks.by_ref().take(ACK_CHUNK).collect();
            let pending = pending.min(chunk.len());
            self.tally.acks += pending as u64;
            self.tally.acks_not_pending += (chunk.len() - pending) as u64;
            if pending == 0 {
                for ack in chunk {
                    self.answer(ack.session, ack.text, Refusal::NotPendingInGroup);
                }
            } else if pending < chunk.len() {
                let (first, last) = chunk.iter().fold((StreamId::MAX, StreamId::ZERO), |(first, last), ack| {
                    (first.min(ack.stream_id), last.max(ack.stream_id))
                });
                let this = Shortfall { acked: chunk.len(), not_pending: chunk.len() - pending, first, last };
                shortfall = Some(match shortfall {
                    None => this,
                    Some(so_far) => Shortfall {
                        acked: so_far.acked + this.acked,
                        not_pending: so_far.not_pending + this.not_pending,
                        first: so_far.first.min(this.first),
                        last: so_far.last.max(this.last),
                    },
                });
            }
        }
        shortfall
    }

    /// A Redis write of these entries failed (`message` says what happened
    /// to them): the verdicts that asked for it are answered UNAVAILABLE,
    /// and the entries wait until `retry_at`. They come back only if still
    /// pending (the re-delivery checks), so an applied ack is not undone.
    pub(crate) fn not_written(
        &mut self,
        entries: impl IntoIterator<Item = (StreamId, Option<(SessionId, String)>)>,
        message: &str,
        retry_at: Instant,
    ) {
        for (stream_id, verdict) in entries {
            self.wait(stream_id, retry_at);
            if let Some((session, text)) = verdict {
                self.answer(session, text, Refusal::Unavailable(message.to_owned()));
            }
        }
    }

    /// What `dead_letter.lua` did with each of `orders`, to
    /// `dead_letter_stream`: a moved entry is done here; the Fail that asked
    /// for one that did not move is told why (deleted, or no longer this
    /// consumer's).
    pub(crate) fn dead_lettered(
        &mut self,
        orders: Vec<DeadLetterOrder>,
        outcomes: Vec<(StreamId, DeadLettered)>,
        dead_letter_stream: &str,
    ) {
        for ((stream_id, outcome), order) in outcomes.into_iter().zip(orders) {
            let refusal = match outcome {
                DeadLettered::Moved { dead_id, deliveries } => {
                    self.entries.remove(&stream_id);
                    // `dead_letter.lua` freed the entry's key, if it had one:
                    // the waiting entries are put through the gate now.
                    if !self.key_waits.is_empty() {
                        self.next_key_poll = Some(self.wall_clock.0);
                    }
                    self.tally.dead_letters += 1;
                    tracing::warn!(stream = %self.stream, group = %self.group, %stream_id, deliveries, %dead_letter_stream, %dead_id, "entry dead-lettered: {}", order.reason);
                    continue;
                }
                DeadLettered::Deleted => {
                    self.trimmed(stream_id);
                    Refusal::Gone(Gone::Deleted)
                }
                DeadLettered::NotOurs => Refusal::NotDeadLettered,
            };
            if let Some((session, text)) = order.verdict {
                self.answer(session, text, refusal);
            }
        }
    }

    /// Answers call `session`'s verdict on `text` (if the call is still attached).
    pub(crate) fn answer(&mut self, session: SessionId, text: String, refusal: Refusal) {
        if self.calls.contains_key(&session) {
            self.refuse(session, text, refusal);
        }
    }

    /// Moves the effects queued since the last call into `into` (empty; its
    /// allocation is reused for the next ones).
    pub(crate) fn take_effects(&mut self, into: &mut Vec<Effect<D>>) {
        debug_assert!(into.is_empty());
        std::mem::swap(&mut self.effects, into);
    }

    /// What was counted since the worker last recorded it; the worker drains it.
    pub(crate) fn tally(&mut self) -> &mut Tally {
        &mut self.tally
    }

    /// The Redis writes queued since the last call.
    pub(crate) fn take_orders(&mut self) -> Orders {
        std::mem::take(&mut self.orders)
    }

    /// Panics unless each entry the ledger tracks is in exactly one state and
    /// the states agree with their index: every `entries` record names a
    /// held delivery, a ready entry or a waiting one that is there, and
    /// every one of those has its record; a call holds no more than its
    /// credit and never an id it was told it lost.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        for (stream_id, track) in &self.entries {
            match *track {
                Track::Held(session, id) => {
                    let held = self.calls.get(&session).and_then(|call| call.held.get(&id));
                    assert_eq!(held.map(|h| h.stream_id), Some(*stream_id), "{stream_id} is not held as recorded");
                }
                Track::Ready => {
                    let copies = self.ready.iter().filter(|out| out.stream_id == *stream_id).count();
                    assert_eq!(copies, 1, "{stream_id} is recorded ready, and is so {copies} times");
                }
                Track::Waiting(at) => {
                    assert!(self.waiting.contains(&(at, *stream_id)), "{stream_id} is not waiting as recorded")
                }
                Track::KeyWaiting => {
                    assert!(self.key_waits.contains(*stream_id), "{stream_id} is not waiting for its key as recorded")
                }
            }
        }
        for (session, call) in &self.calls {
            for (id, held) in &call.held {
                let track = self.entries.get(&held.stream_id);
                assert_eq!(track, Some(&Track::Held(*session, *id)), "held {id} has another record");
                assert!(!call.gone.contains_key(id), "{id} is both held and gone");
            }
            assert!(call.held.len() <= call.policy.max_in_flight as usize, "call {session} holds over its credit");
            assert!(call.window.size() <= call.policy.max_in_flight, "call {session}'s window is over its cap");
            if let Some(due) = call.window.stall_due().filter(|_| call.free() == 0 && !call.closed) {
                let check = self.stall_check;
                assert!(check.is_some_and(|at| at <= due), "call {session} stalls at {due:?}, looked at {check:?}");
            }
        }
        for out in &self.ready {
            assert_eq!(self.entries.get(&out.stream_id), Some(&Track::Ready), "ready {} unrecorded", out.stream_id);
        }
        for (at, stream_id) in &self.waiting {
            assert_eq!(self.entries.get(stream_id), Some(&Track::Waiting(*at)), "waiting {stream_id} unrecorded");
        }
        for stream_id in self.key_waits.ids() {
            assert_eq!(self.entries.get(&stream_id), Some(&Track::KeyWaiting), "key-waiting {stream_id} unrecorded");
        }
        let states = self.held() + self.ready.len() + self.waiting.len() + self.key_waits.len();
        assert_eq!(self.entries.len(), states, "the index and the states disagree");
        assert!(self.free() <= self.free_for_due() && self.free_for_due() <= self.slots());
    }

    /// Whether Redis writes are queued.
    pub(crate) fn has_orders(&self) -> bool {
        let o = &self.orders;
        !(o.acks.is_empty()
            && o.retry_writes.is_empty()
            && o.dead_letters.is_empty()
            && o.emits.is_empty()
            && o.releases.is_empty())
    }
}

/// Call `shard`'s share of a sharded call's `max_in_flight`: an even split,
/// the remainder to the first shards, so a busy shard cannot starve the
/// others. (Validation raised `max_in_flight` to at least one per shard.)
pub(crate) fn shard_share(max_in_flight: u32, shards: u32, shard: u32) -> u32 {
    max_in_flight / shards + u32::from(shard < max_in_flight % shards)
}

#[cfg(test)]
mod tests;
