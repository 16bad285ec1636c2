//! The group worker: one task per (stream, group) in this sidecar, serving
//! every call subscribed to that pair under the sidecar's one consumer name.
//!
//! A driver: it takes commands from calls and applies them to the
//! [`Ledger`] (the bookkeeping and the rules, synchronous), has the
//! [`Outlet`] carry out the ledger's effects before every await, carries out
//! the Redis work the ledger asks for (and [`Pacing`] allows), and runs each
//! job of the consume path on its beat. Each job's Redis
//! step is a wrapper in the file of its job, beside its script, that returns
//! an outcome enum and knows nothing of the worker:
//! [`reader`](super::reader), [`recovery`](super::recovery),
//! [`retry`](super::retry), [`lease`](super::lease) (reclaim and lease
//! refresh), [`dead_letter`](super::dead_letter), [`settle`](super::settle),
//! [`release`](super::release),
//! [`hygiene`](super::hygiene), [`gauges`](super::gauges); this file feeds
//! those outcomes back. Nothing outside it has an `impl Worker`.

use std::{sync::atomic::Ordering, sync::Arc, time::Duration};

use redis::{RedisError, RedisResult};
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
    time::{interval, sleep_until, Instant, MissedTickBehavior},
};
use tracing::{debug, info, warn};

use super::{
    ack_emit,
    commands::{AckEmit, Command, Extend, InFlight, Verdicts},
    dead_letter,
    delivery::{self, Outgoing},
    gauges, hygiene,
    keyed::{self, Checked, Gate},
    lease,
    ledger::{Ledger, Shortfall, Work},
    orders::{DeadLetterOrder, EmitOrder, PendingAck, Redelivery, ReleaseOrder, RetryWrite, SessionId},
    outlet::Outlet,
    pacing::{log_limited, Pacing, Step},
    reader::{self, KeyedRead, Read, Reader},
    recovery, release, retry, settle,
    verdicts::Gone,
    GroupKeys, Shared,
};
use crate::{error::Error, id::StreamId, redis::RawEntry, wire::OutgoingDelivery};

/// What became of an entry read or claimed (see [`Worker::build`]).
// A return value, moved at once and never stored: boxing the delivery would
// cost an allocation per entry on the hot path for nothing.
#[allow(clippy::large_enum_variant)]
enum Built {
    /// A delivery to offer (or, with a key, to put through the gate).
    Out(Outgoing),
    /// Too large for a frame: for the dead-letter step.
    DeadLetter(DeadLetterOrder),
    /// Deleted, or without a branded id: nothing to hand out.
    Nothing,
}

/// What woke an idle worker (see [`Worker::turn`]).
enum Woke {
    /// A call's command; those queued behind it are taken in the same turn.
    Commands(Command),
    /// The reader's reply.
    Read(RedisResult<Read>),
    RefreshLeases,
    Reclaim,
    /// Held entries are due for the ack deadline check.
    Deadlines,
    /// The group's state is due to be polled into gauges.
    Poll,
    Hygiene,
    /// Nothing to do but move work forward: a due time passed, or a state
    /// change was taken in already.
    Check,
}

/// The most entries one XREADGROUP or claim asks for.
const BATCH_MAX: usize = 512;
/// Room left in a frame for the ConsumeResponse wrapper around a Delivery (bytes).
const FRAME_OVERHEAD: usize = 16;
/// How often held entries are checked against their ack deadlines.
const DEADLINE_CHECK: Duration = Duration::from_millis(100);
/// How many XAUTOCLAIM pages one reclaim beat may walk.
const RECLAIM_PAGES_PER_BEAT: usize = 8;
/// Commands taken in one go, so that their acks reach Redis as one script run.
const COMMANDS_PER_TURN: usize = 1024;
/// Commands a group's channel holds before its calls' relays wait. A relay
/// stops reading its client while the worker's answers pile up, but only
/// once they exist: every command queued ahead of them may still make one
/// answer per id (an Ack of a thousand unknown ids makes a thousand), so
/// this bounds what a client that sends without reading can make the
/// sidecar hold. At 1,024 a test run under load took 300 such Acks and
/// grew by over 40 MiB.
const COMMANDS_QUEUED: usize = 64;
/// Hygiene beats a worker stays with no call before it retires (10 to 20 s
/// at the default beat): long enough that a client reconnecting finds it,
/// short enough that groups clients came and went from cost nothing.
const RETIRE_AFTER_BEATS: u32 = 2;

/// One group's worker. Built by [`Worker::spawn`].
pub(crate) struct Worker {
    keys: GroupKeys,
    shared: Arc<Shared>,
    ledger: Ledger<Box<OutgoingDelivery>>,
    /// Calls' channels, delivery spans, metrics: where the ledger's effects go.
    outlet: Outlet,
    pacing: Pacing,
    /// At-most-once: reads with NOACK, nothing is pending, verdicts only free credit.
    no_ack: bool,
    /// Calls waiting for the next flush before they end.
    flushed: Vec<oneshot::Sender<()>>,
    /// The reader (and a blocking one's connection), while there are calls
    /// to read for: started by the first call's Attach, stopped when the last
    /// call leaves or the sidecar drains.
    reader: Option<Reader>,
    /// What `--shared-readers auto` chooses the reader by: the sidecars
    /// serving the group at the last hygiene beat, and how often reads found
    /// entries lately.
    demand: reader::Demand,
    /// How often this sidecar's reads of the group found entries since the
    /// last measure.
    read_rate: reader::ReadRate,
    /// The demand calls for the other kind of reader: switch at the next
    /// read's end, when no read is under way.
    reader_switch_due: bool,
    reclaim_cursor: StreamId,
    /// The group is gone (NOGROUP): re-create it before anything else.
    group_lost: bool,
    /// The hygiene beat found the stream deleted and said so; cleared (and
    /// said) when a beat finds it again, so the log has one line per loss.
    stream_gone: bool,
    /// Keeps the worker running while no call holds a sender to it. Dropped
    /// when it retires (no call for [`RETIRE_AFTER_BEATS`] hygiene beats, or
    /// none left while draining): it then ends once the last sender is gone.
    /// The worker map holds only a weak sender, so a call that subscribes
    /// meanwhile either reaches this worker (which then stays) or, once the
    /// worker's channel is closed, starts a new one.
    keepalive: Option<mpsc::Sender<Command>>,
    /// To take `keepalive` back when a call attaches while retiring.
    own: mpsc::WeakSender<Command>,
    /// Hygiene beats in a row that found no call.
    beats_without_calls: u32,
    /// Hygiene beats that reached Redis, for which are thorough
    /// ([`hygiene::thorough_every`]): the first is.
    hygiene_beats: u64,
    /// The room among their calls' ids in flight of the verdicts handled
    /// since the last [`Worker::act`], given back there, once their answers
    /// are handed out: given back before, it would let a relay send more
    /// ids while those answers still sat in the ledger.
    answered: Vec<InFlight>,
}

impl Worker {
    /// Starts the worker for `stream` and `group`, and returns the sender of
    /// its commands. The worker ends when it has retired (see
    /// [`Worker::keepalive`]) and every sender is dropped.
    pub(crate) fn spawn(
        shared: Arc<Shared>,
        stream: String,
        group: String,
        no_ack: bool,
    ) -> (mpsc::Sender<Command>, JoinHandle<()>) {
        let (commands_tx, commands) = mpsc::channel(COMMANDS_QUEUED);
        let metrics = shared.metrics.group(&stream, shared.redis.keys.sharded_stream_of(&stream), &group);
        for step in Step::ALL {
            let _ = metrics.redis_errors(step.label());
        }
        let traced = crate::telemetry::exporting();
        let mut ledger = Ledger::new(&stream, &group, no_ack, *shared.draining.borrow(), traced);
        ledger.set_wall_clock(Instant::now(), crate::entry::now_unix_ms());
        ledger.set_key_wait_poll(shared.key_wait_poll);
        let worker = Worker {
            outlet: Outlet::new(&stream, &group, metrics, traced, no_ack),
            keys: GroupKeys::new(&shared, stream, group),
            ledger,
            pacing: Pacing::new(Instant::now()),
            no_ack,
            flushed: Vec::new(),
            reader: None,
            demand: reader::Demand::default(),
            read_rate: reader::ReadRate::new(Instant::now()),
            reader_switch_due: false,
            reclaim_cursor: StreamId::ZERO,
            group_lost: false,
            stream_gone: false,
            keepalive: Some(commands_tx.clone()),
            own: commands_tx.downgrade(),
            beats_without_calls: 0,
            hygiene_beats: 0,
            answered: Vec::new(),
            shared,
        };
        // Boxed: an async fn keeps its arguments in its state beside the
        // locals they are moved into, so a worker passed by value took its
        // 2 KB twice in every group's task.
        (commands_tx, tokio::spawn(Box::new(worker).run(commands)))
    }

    async fn run(mut self: Box<Self>, mut commands: mpsc::Receiver<Command>) {
        let shared = self.shared.clone();
        let mut draining = shared.draining.clone();
        let mut redis_up = shared.redis_up.clone();
        let mut refresh = interval(shared.lease_refresh);
        let mut reclaim = interval(shared.reclaim_interval);
        let mut deadlines = interval(DEADLINE_CHECK);
        let mut poll = interval(shared.metrics_poll.unwrap_or(Duration::from_secs(3600)));
        let mut hygiene = interval(hygiene::beat_interval(shared.consumer_idle_limit));
        for tick in [&mut refresh, &mut reclaim, &mut deadlines, &mut hygiene, &mut poll] {
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        }
        let mut switches = self.keys.redis.primary().map(|primary| primary.watch());
        info!(stream = %self.keys.stream, group = %self.keys.group, consumer = %shared.consumer, "group worker started");
        Box::pin(self.advance()).await;
        loop {
            let wake = self.next_wake();
            // Only what wakes the worker is awaited here; the work it calls
            // for runs in `turn`, boxed, so that an idle worker's task does
            // not keep room for its largest Redis step: inline, that made
            // each worker's task 15.7 KB (heap profile, 1,000 idle groups).
            let woke = tokio::select! {
                command = commands.recv() => {
                    let Some(command) = command else { break };
                    Woke::Commands(command)
                }
                result = reader::next_read(&mut self.reader) => Woke::Read(result),
                () = recovery::primary_switched(&mut switches) => {
                    self.after_primary_switch();
                    Woke::Check
                }
                // Redis answers the readiness check again: a step that failed
                // through the outage need not wait out its backoff (up to 5 s).
                Ok(()) = redis_up.changed() => {
                    if *redis_up.borrow_and_update() {
                        self.pacing.restart(Instant::now());
                    }
                    Woke::Check
                }
                _ = sleep_until(wake) => Woke::Check,
                _ = refresh.tick() => Woke::RefreshLeases,
                _ = reclaim.tick(), if !shared.batched_reclaim => Woke::Reclaim,
                _ = deadlines.tick(), if self.ledger.has_deadlines() => Woke::Deadlines,
                _ = poll.tick(), if shared.metrics_poll.is_some() => Woke::Poll,
                _ = hygiene.tick() => Woke::Hygiene,
                Ok(()) = draining.changed() => {
                    let now_draining = *draining.borrow();
                    self.ledger.set_draining(now_draining);
                    if now_draining {
                        self.stop_reading();
                    }
                    Woke::Check
                }
            };
            Box::pin(self.turn(woke, &mut commands)).await;
        }
        Box::pin(self.flush()).await;
        self.stop_reading();
        self.publish_held();
        info!(stream = %self.keys.stream, group = %self.keys.group, "group worker stopped");
    }

    /// Does what woke the worker, then moves work forward ([`Worker::advance`]).
    async fn turn(&mut self, woke: Woke, commands: &mut mpsc::Receiver<Command>) {
        match woke {
            Woke::Commands(command) => {
                self.handle(command).await;
                // Take whatever else is queued, so acks go out as one script run.
                for _ in 0..COMMANDS_PER_TURN {
                    match commands.try_recv() {
                        Ok(command) => self.handle(command).await,
                        Err(_) => break,
                    }
                }
                self.flush().await;
            }
            Woke::Read(result) => self.on_read(result).await,
            Woke::RefreshLeases => self.refresh_leases().await,
            Woke::Reclaim => self.reclaim().await,
            Woke::Deadlines => {
                let now = Instant::now();
                self.ledger.set_wall_clock(now, crate::entry::now_unix_ms());
                self.ledger.expire(now);
                // Their retry delays go to Redis now, to bind peers and
                // outlive a restart, not with the next verdict.
                self.flush().await;
            }
            Woke::Poll => {
                if self.redis_usable() {
                    self.act();
                    gauges::poll(&self.keys, &self.outlet.metrics).await;
                }
            }
            Woke::Hygiene => {
                self.hygiene().await;
                self.beats_without_calls = if self.ledger.has_calls() { 0 } else { self.beats_without_calls + 1 };
            }
            Woke::Check => {}
        }
        if self.beats_without_calls >= RETIRE_AFTER_BEATS || (self.ledger.draining() && !self.ledger.has_calls()) {
            self.retire();
        }
        // What the beat just found (entries deleted while pending) is
        // counted as its effects are carried out: before the log line.
        self.act();
        self.outlet.log_trimmed();
        self.log_held_back();
        self.advance().await;
    }

    /// Acks Redis found partly not pending, at WARN a line a second
    /// sidecar-wide (a client acking what others acknowledged does it with
    /// every batch), the rest at DEBUG; `echomq_acks_not_pending_total`
    /// counts each.
    fn log_shortfall(&self, shortfall: Shortfall) {
        let (stream, group) = (&self.keys.stream, &self.keys.group);
        let Shortfall { acked, not_pending, first, last } = shortfall;
        let line = "some acknowledged entries were no longer pending for the group (another client acknowledged them); XACK does not say which, so none is answered NOT_PENDING";
        log_limited!(self.shared.shortfall_log, line; %stream, %group, acked, not_pending, %first, %last);
    }

    /// The count of a burst's lines held back by the sidecar-wide limits
    /// (see [`super::pacing::LogLimit::overdue`]), once the burst is over.
    fn log_held_back(&self) {
        let now = Instant::now();
        for limit in self.shared.log_limits() {
            limit.log_overdue(now);
        }
    }

    /// No call has needed this worker for a while (or the sidecar drains):
    /// it lets go of its own sender and ends once no other is left. What its
    /// calls held is pending in Redis: the next worker here recovers it, or a
    /// peer reclaims it.
    fn retire(&mut self) {
        if self.keepalive.take().is_some() && !self.ledger.draining() {
            info!(stream = %self.keys.stream, group = %self.keys.group, beats = self.beats_without_calls, "no call for {} hygiene beats: the group's worker retires", self.beats_without_calls);
        }
    }

    /// Moves work forward (unless draining) and carries out what the ledger
    /// decided, before the worker waits again.
    async fn advance(&mut self) {
        if !self.ledger.draining() {
            self.pump().await;
        }
        self.act();
        self.publish_held();
    }

    /// Carries out what the ledger decided (see [`Outlet::act`]). Called
    /// before every await, so nothing the ledger decided waits on Redis.
    fn act(&mut self) {
        self.outlet.act(&mut self.ledger);
        self.answered.clear();
        let (stream, group) = (&self.keys.stream, &self.keys.group);
        for (session, held) in self.ledger.tally().capped_calls.drain(..) {
            let line =
                "a call holds all the entries its window's cap allows and settles none: its handler may be stuck, \
                        or it waits for more deliveries than the cap before settling, which it will never get; such a \
                        client must subscribe with max_in_flight of at least its batch (or the sidecar raise \
                        --default-max-in-flight)";
            log_limited!(self.shared.window_cap_log, line; %stream, %group, %session, held);
        }
    }

    fn publish_held(&mut self) {
        self.outlet.publish_held(self.ledger.held(), &self.shared.held);
        self.outlet.metrics.key_waiting_entries.set(self.ledger.key_waiting() as i64);
    }

    async fn handle(&mut self, command: Command) {
        let now = Instant::now();
        // Only a Fail or a call's end writes retry states (due times in unix
        // ms): the clock is read for those, not for every Ack. Between
        // readings the ledger counts on from the last one by `Instant`.
        if matches!(command, Command::Fail { .. } | Command::Detach { .. }) {
            self.ledger.set_wall_clock(now, crate::entry::now_unix_ms());
        }
        match command {
            Command::Attach(attach) => {
                let super::commands::Attach { session, shard, policy, group, events, reply } = *attach;
                self.beats_without_calls = 0;
                if self.keepalive.is_none() {
                    // The call holds a sender: this cannot fail.
                    self.keepalive = self.own.upgrade();
                    info!(stream = %self.keys.stream, group = %self.keys.group, "a call subscribed while the group's worker was retiring: it stays");
                }
                let mut attached = self.ledger.attach(session, shard, policy, group);
                if attached.is_ok() {
                    self.outlet.link(session, events);
                    attached = self.start_reader().await;
                    if attached.is_err() {
                        self.ledger.detach(session, now);
                        self.unlink(session);
                    }
                }
                let _ = reply.send(attached);
            }
            Command::Ack(verdicts) => {
                let Verdicts { session, ids, in_flight } = *verdicts;
                self.ledger.ack_all(session, ids, now);
                self.answered.push(in_flight);
            }
            Command::Fail { session, fail } => self.ledger.fail(session, *fail, now),
            Command::Release(verdicts) => {
                let Verdicts { session, ids, in_flight } = *verdicts;
                self.ledger.release(session, ids, now);
                self.answered.push(in_flight);
            }
            Command::AckEmit { session, ack_emit } => {
                let AckEmit { text, id, emits } = *ack_emit;
                self.ledger.ack_emit(session, text, id, emits, now)
            }
            Command::Extend { session, extend } => {
                let Extend { ids, by, in_flight } = *extend;
                self.ledger.extend(session, ids, by, now);
                self.answered.push(in_flight);
            }
            Command::Drain { session } => {
                self.ledger.drain_call(session);
                // A read blocked for the drained calls would take entries
                // that no call takes (and, at most once, lose them).
                if !self.ledger.has_open_calls() {
                    self.stop_reading();
                }
            }
            Command::Detach { session, flushed } => {
                // The call's last verdicts first, so that their errors still
                // reach it (after a client closed its side, it still reads).
                self.carry_out_orders().await;
                let detached = self.ledger.detach(session, now);
                self.unlink(session);
                if self.ledger.draining() {
                    self.shared.returned_while_draining.fetch_add(detached.returned, Ordering::Relaxed);
                }
                if detached.returned > 0 && !self.no_ack {
                    info!(stream = %self.keys.stream, group = %self.keys.group, returned = detached.returned, "call ended holding entries; they stay pending and will be delivered again");
                }
                if detached.last {
                    self.stop_reading();
                }
                self.flushed.push(flushed);
            }
            Command::Reclaim => self.reclaim().await,
        }
    }

    /// Forgets an ended call's channel.
    fn unlink(&mut self, session: SessionId) {
        self.outlet.unlink(session, &mut self.ledger);
    }

    /// Carries out the queued Redis writes, then lets ending calls go.
    async fn flush(&mut self) {
        self.carry_out_orders().await;
        for call in self.flushed.drain(..) {
            let _ = call.send(());
        }
    }

    /// The Redis writes the ledger queued: dead letters first (their Fails
    /// settle nothing else), then acks and retry states as one `settle.lua`
    /// run, then AckEmits, then releases. All before the pump's next
    /// re-delivery, which would otherwise claim a released entry before it
    /// was given back.
    async fn carry_out_orders(&mut self) {
        self.act();
        // A second round for what the first queued: a refused AckEmit's
        // retry state, recorded now as a Fail's is, to bind peers and
        // outlive a restart.
        for _ in 0..2 {
            if !self.ledger.has_orders() {
                break;
            }
            let orders = self.ledger.take_orders();
            if !orders.dead_letters.is_empty() {
                self.dead_letter(orders.dead_letters).await;
            }
            if !orders.acks.is_empty() || !orders.retry_writes.is_empty() {
                self.settle(orders.acks, orders.retry_writes).await;
            }
            if !orders.emits.is_empty() {
                self.ack_emit(orders.emits).await;
            }
            if !orders.releases.is_empty() {
                self.release(orders.releases).await;
            }
        }
        self.act();
    }

    /// Cuts off the blocked XREADGROUP, so no entry appended meanwhile is
    /// taken with no call to hand it to: on shutdown, and when the last call
    /// leaves. Its connection goes back to the pool for another group (or is
    /// closed, if a read was in flight).
    ///
    /// A read cut off may already have run in Redis (its reply on the way, or
    /// even queued here unread): its entries are then pending for this
    /// consumer, so the own PEL is recovered before the next new read.
    fn stop_reading(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.stop();
            self.outlet.metrics.reader_blocking.set(0);
            if self.ledger.is_reading() {
                self.recover_after_lost_read();
            }
        }
        self.ledger.read_done();
    }

    /// Starts the reader, for the group's first call. A reader that is to
    /// block on a connection of its own (`--shared-readers off`, a cluster)
    /// takes it from the pool here, at subscribe, so a group that cannot have
    /// one is refused there (RESOURCE_EXHAUSTED, naming
    /// `--reader-connections`) instead of leaving its call waiting; a shared
    /// reader takes one per read, and is never refused. With `auto`, a group
    /// that many sidecars serve, or a busy one ([`reader::wants_blocking`]),
    /// blocks if a connection is free at once, and shares otherwise. While draining
    /// nothing is read: no reader.
    ///
    /// Errors: as [`ReaderPool::acquire`](crate::redis::readers::ReaderPool::acquire).
    async fn start_reader(&mut self) -> Result<(), Error> {
        if self.reader.is_some() || self.ledger.draining() {
            return Ok(());
        }
        let shared = self.shared.clone();
        let mode = match (&shared.readers.blocking, &shared.readers.shared) {
            (Some(pool), Some(shared)) => match self.blocking_connection(pool).await {
                Some(conn) => reader::Mode::Blocking(Box::new(conn)),
                None => reader::Mode::Shared(shared.clone()),
            },
            (None, Some(shared)) => reader::Mode::Shared(shared.clone()),
            (Some(pool), None) => {
                self.act();
                reader::Mode::Blocking(Box::new(pool.acquire(&self.keys.stream, &self.keys.group).await?))
            }
            (None, None) => unreachable!("a sidecar has blocking readers, shared ones, or both"),
        };
        self.set_reader(mode);
        Ok(())
    }

    /// With both ways to read (`--shared-readers auto`), for a group that
    /// shares now or has no reader yet: a connection for a blocking reader
    /// when the group's demand calls for one ([`reader::wants_blocking`]) and
    /// one is free at once; `None`: it shares.
    async fn blocking_connection(
        &mut self,
        pool: &crate::redis::readers::ReaderPool,
    ) -> Option<crate::redis::readers::ReaderConnection> {
        if !reader::wants_blocking(self.demand, false) {
            return None;
        }
        self.act();
        pool.try_acquire().await
    }

    fn set_reader(&mut self, mode: reader::Mode) {
        let (stream, group) = (self.keys.stream.clone(), self.keys.group.clone());
        // The group's settings are the first call's: a group with per-key
        // limits registers and gates what it reads in one script.
        let keyed =
            self.ledger.key_limit().map(|limit| KeyedRead { zset: self.keys.keyed.clone(), limit: limit.clone() });
        let reader = Reader::new(self.shared.clone(), mode, stream, group, self.no_ack, keyed);
        self.outlet.metrics.reader_blocking.set(i64::from(reader.is_blocking()));
        self.reader = Some(reader);
    }

    /// With `--shared-readers auto`, after a hygiene beat measured the
    /// group's demand: when it calls for the other kind of reader, the switch
    /// is made at the end of the read under way ([`Worker::reconsider_reader`]).
    /// A shared reader waiting for a wake-up is asked to end its wait with an
    /// empty read; a blocking one ends its read within `--read-block-ms`.
    fn switch_reader_soon(&mut self) {
        let Some(reader) = &self.reader else { return };
        if self.shared.readers.per_group().is_none() {
            return;
        }
        let blocking = reader.is_blocking();
        if reader::wants_blocking(self.demand, blocking) != blocking {
            self.reader_switch_due = true;
            reader.yield_now();
        }
    }

    /// With `--shared-readers auto`, at the end of a read (none is under
    /// way, so none is cut off, and no entry read costs an attempt): a shared
    /// reader turns blocking once more than
    /// [`SHARED_MOST_SIDECARS`](crate::config::SHARED_MOST_SIDECARS) serve
    /// the group or it is busy (if a connection is free; else it tries again
    /// at the next measure), and a blocking one turns shared once few serve
    /// it and it is quiet.
    async fn reconsider_reader(&mut self) {
        self.reader_switch_due = false;
        let all = self.shared.clone();
        let Some((pool, shared)) = all.readers.per_group() else { return };
        let Some(blocking) = self.reader.as_ref().map(Reader::is_blocking) else { return };
        let mode = if blocking {
            if reader::wants_blocking(self.demand, true) {
                return;
            }
            reader::Mode::Shared(shared.clone())
        } else {
            match self.blocking_connection(pool).await {
                Some(conn) => reader::Mode::Blocking(Box::new(conn)),
                None => return,
            }
        };
        let reader::Demand { sidecars, reads_per_second } = self.demand;
        let now = if blocking { "shares again" } else { "blocks on a connection of its own now" };
        let serve = if sidecars == 1 { "1 sidecar serves" } else { &format!("{sidecars} sidecars serve") };
        info!(stream = %self.keys.stream, group = %self.keys.group, sidecars, reads_per_second, blocking = !blocking, "its reader {now} (--shared-readers auto): {serve} the group, and its reads found entries {reads_per_second:.1} times a second");
        self.stop_reading();
        self.set_reader(mode);
    }

    /// Asks the reader for `count` new entries. There is one whenever there
    /// are calls to read for and no drain.
    fn read(&mut self, count: usize) {
        if self.reader.as_mut().is_some_and(|reader| reader.request(count)) {
            self.ledger.reading(count);
        }
    }

    fn next_wake(&self) -> Instant {
        let far = Instant::now() + Duration::from_secs(3600);
        if self.ledger.draining() {
            return far;
        }
        // After a failed command, the pump retries at the end of the pause.
        if self.paused() && (self.ledger.free() > 0 || self.group_lost) {
            return self.pacing.paused_until();
        }
        // Both concern calls out of credit: a read held back for too little
        // of it, and a call whose window may open up.
        let read_due = self.ledger.read_due().map_or(far, |at| at.min(far));
        let credit_due = self.ledger.stall_due().map_or(read_due, |at| at.min(read_due));
        if self.ledger.free_for_due() == 0 {
            return credit_due;
        }
        let key_poll = self.ledger.key_poll_due().unwrap_or(far);
        self.ledger.next_due().map_or(far, |at| at.min(far)).min(credit_due).min(key_poll)
    }

    fn paused(&self) -> bool {
        self.pacing.paused(Instant::now())
    }

    /// Whether a beat that only reads or refreshes may use Redis now: while
    /// paused or without a group, it could only fail again and push the
    /// pause out, starving the pump that re-creates the group.
    fn redis_usable(&self) -> bool {
        !(self.no_ack || self.group_lost || self.paused())
    }

    /// A Redis step failed: pause (with the step's own backoff, see
    /// [`Pacing`]), and count it, unless it found the group gone, which is
    /// expected (the stream was deleted, or Redis lost its data) and
    /// recovered from by re-creating the group: that counts in
    /// `echomq_group_recreations_total`, not as an error.
    fn redis_failed(&mut self, step: Step, error: &RedisError) {
        let pause = self.pacing.failed(step, Instant::now());
        if reader::is_group_lost(error) {
            if !self.group_lost {
                // Redis restarted empty, or streams were deleted: every group at once.
                self.warn_limited(&format!("the group is gone ({error}); re-creating it"));
            }
            self.group_lost = true;
        } else {
            self.outlet.metrics.redis_errors(step.label()).inc();
            let redis = self.keys.redis.target();
            self.warn_limited(&format!("{} failed, retrying in {pause:?}: {error} (Redis at {redis})", step.doing()));
        }
    }

    /// `line` at WARN, or at DEBUG while the sidecar-wide limit of one such
    /// line a second holds it back ([`super::pacing::LogLimit`]): through an
    /// outage every group's worker fails at once.
    fn warn_limited(&self, line: &str) {
        let (stream, group) = (&self.keys.stream, &self.keys.group);
        log_limited!(self.shared.failure_log, line; %stream, %group);
    }

    /// Moves work forward while Redis may be used and there is credit: the
    /// group first if it is lost, then what [`Ledger::next_work`] says.
    async fn pump(&mut self) {
        self.ledger.hand_out_ready(Instant::now());
        if self.paused() || (self.group_lost && !self.recreate_group().await) {
            return;
        }
        while !self.paused() {
            match self.ledger.next_work(Instant::now(), BATCH_MAX) {
                Some(Work::Redeliver(due)) => self.redeliver(due).await,
                Some(Work::RecoverPage { after, count }) => self.recover_page(after, count).await,
                Some(Work::KeyGate(candidates)) => self.key_gate(candidates).await,
                Some(Work::Read(count)) => return self.read(count),
                None => return,
            }
        }
    }

    /// Builds the delivery of an entry read or claimed (its delivery
    /// counted: `attempts`), with its keyed member when the group has a key
    /// field; an entry too large for a frame is returned for the
    /// dead-letter step instead: a frame the client could not receive would
    /// end its call (and the next, and the next).
    fn build(&mut self, entry: RawEntry, attempts: u32) -> Built {
        let stream_id = entry.id;
        let Some(fields) = entry.fields else {
            self.ledger.trimmed(stream_id);
            return Built::Nothing;
        };
        let keys = &self.keys;
        let key_field = self.ledger.key_limit().map(|limit| limit.field.as_str());
        let Some(out) = delivery::build(&keys.origin, &keys.id_field, key_field, stream_id, fields, attempts) else {
            warn!(stream = %keys.stream, %stream_id, "entry has no branded id (its milliseconds exceed 6 bytes); it stays pending");
            return Built::Nothing;
        };
        let size = out.body.encoded_len() + FRAME_OVERHEAD;
        if size > self.shared.max_message_bytes {
            let reason = format!(
                "the entry's delivery frame is {size} bytes, over the sidecar's --max-message-bytes ({})",
                self.shared.max_message_bytes
            );
            return Built::DeadLetter(DeadLetterOrder { stream_id, reason, verdict: None });
        }
        Built::Out(out)
    }

    /// Puts entries this sidecar holds pending but has not handed out
    /// (claimed again, or waiting for their key) through the per-key gate:
    /// those it lets through are offered to the calls, the others wait for
    /// their key. When the gate cannot be asked, they all wait (the next
    /// poll asks again).
    async fn gate_and_offer(&mut self, outs: Vec<Outgoing>) {
        let Some(per_key) = self.ledger.key_limit().map(|limit| limit.per_key) else {
            for out in outs {
                self.ledger.offer(out, Instant::now());
            }
            return;
        };
        let candidates: Vec<(StreamId, Vec<u8>)> =
            outs.iter().filter_map(|out| Some((out.stream_id, out.member.clone()?))).collect();
        let checked = if candidates.is_empty() {
            Vec::new()
        } else {
            self.act();
            match keyed::gate(&self.keys, per_key, &candidates).await {
                Ok(checked) => {
                    self.pacing.succeeded(Step::KeyGate);
                    self.ledger.key_gate_checked(candidates.len());
                    checked
                }
                Err(e) => {
                    self.redis_failed(Step::KeyGate, &e);
                    vec![Checked::Waits; candidates.len()]
                }
            }
        };
        let mut verdicts = checked.into_iter();
        let now = Instant::now();
        for out in outs {
            if out.member.is_none() {
                self.ledger.offer(out, now);
                continue;
            }
            match verdicts.next() {
                Some(Checked::Admitted) => self.ledger.offer(out, now),
                // Claimed a moment ago, so rarely; never handed out.
                Some(Checked::Gone) => {
                    self.ledger.forget(out.stream_id, Gone::ToPeer);
                }
                Some(Checked::Waits) | None => self.ledger.key_wait(out, now),
            }
        }
    }

    /// Entries waiting for their key, put through the gate again (see
    /// [`Ledger::key_gated`]).
    async fn key_gate(&mut self, candidates: Vec<(StreamId, Vec<u8>)>) {
        let Some(per_key) = self.ledger.key_limit().map(|limit| limit.per_key) else { return };
        self.act();
        match keyed::gate(&self.keys, per_key, &candidates).await {
            Ok(checked) => {
                self.pacing.succeeded(Step::KeyGate);
                self.ledger.key_gated(candidates, &checked, Instant::now());
            }
            Err(e) => self.redis_failed(Step::KeyGate, &e),
        }
    }

    async fn on_read(&mut self, result: RedisResult<Read>) {
        self.ledger.read_done();
        let Read { entries, gates } = match result {
            Ok(read) => read,
            Err(e) => {
                // A reply lost to a broken or silent connection: Redis may
                // have run the read. An error reply (NOGROUP, …) took nothing.
                if crate::error::is_transient(&e) {
                    self.recover_after_lost_read();
                }
                return self.redis_failed(Step::Read, &e);
            }
        };
        self.pacing.succeeded(Step::Read);
        self.ledger.key_gate_checked(gates.iter().filter(|gate| **gate != Gate::Unkeyed).count());
        let now = Instant::now();
        if !entries.is_empty() {
            self.read_rate.found();
        }
        let mut oversized = Vec::new();
        // A `>` read hands each entry over for the first time: attempts 1.
        // With per-key limits, `keyed_read.lua` gated each keyed entry as it read it.
        for (n, entry) in entries.into_iter().enumerate() {
            match self.build(entry, 1) {
                Built::Out(out) if gates.get(n) == Some(&Gate::Waits) => self.ledger.key_wait(out, now),
                Built::Out(out) => self.ledger.offer(out, now),
                Built::DeadLetter(order) => oversized.push(order),
                Built::Nothing => {}
            }
        }
        if !oversized.is_empty() {
            self.dead_letter(oversized).await;
        }
        // A shared reader that turns busy blocks within a second; a blocking
        // one is judged quiet over a whole beat, so a pause does not cost it
        // its connection.
        let sharing = self.reader.as_ref().is_some_and(|reader| !reader.is_blocking());
        if sharing && self.measure_reads(now) {
            self.reader_switch_due = true;
        }
        if self.reader_switch_due {
            self.reconsider_reader().await;
        }
    }

    /// Sets the demand's reads per second from the reads that found entries
    /// since the last measure, and starts counting anew; false, leaving the
    /// demand as it was, until a rate can be told (see [`reader::ReadRate::measure`]).
    fn measure_reads(&mut self, now: Instant) -> bool {
        let Some(rate) = self.read_rate.measure(now) else { return false };
        self.demand.reads_per_second = rate;
        true
    }
}

// The Redis writes and re-delivery: each job's call, its outcome fed back.
impl Worker {
    /// The dead-letter step, for Fails with `dead_letter`, poison entries and
    /// oversized ones alike. On failure the entries wait and come back.
    async fn dead_letter(&mut self, orders: Vec<DeadLetterOrder>) {
        self.act();
        let dead_letter_stream = self.ledger.settings().map_or_else(
            || self.shared.redis.keys.dead_letter_stream(&self.keys.stream),
            |p| p.dead_letter_stream.clone(),
        );
        let key_field = self.ledger.key_limit().map(|limit| limit.field.clone());
        match dead_letter::dead_letter(&self.keys, &dead_letter_stream, key_field.as_deref(), &orders).await {
            Ok(outcomes) => {
                self.pacing.succeeded(Step::DeadLetter);
                self.ledger.dead_lettered(orders, outcomes, &dead_letter_stream);
            }
            Err(e) => {
                self.redis_failed(Step::DeadLetter, &e);
                let message =
                    format!("dead-lettering failed ({e}); the entry stays pending and will be delivered again");
                let entries = orders.into_iter().map(|order| (order.stream_id, order.verdict));
                self.ledger.not_written(entries, &message, self.pacing.paused_until());
            }
        }
    }

    /// Claims due entries that are still this consumer's and hands them out;
    /// dead-letters those that reached `max_deliveries`.
    async fn redeliver(&mut self, due: Vec<StreamId>) {
        self.act();
        let max_deliveries = self.ledger.settings().map_or(0, |p| p.max_deliveries);
        let outcomes = match retry::redeliver(&self.keys, max_deliveries, &due).await {
            Ok(outcomes) => outcomes,
            Err(e) => {
                self.redis_failed(Step::Redeliver, &e);
                for id in due {
                    self.ledger.wait(id, self.pacing.paused_until());
                }
                return;
            }
        };
        self.pacing.succeeded(Step::Redeliver);
        let (now, now_unix_ms) = (Instant::now(), crate::entry::now_unix_ms());
        let mut to_dead_letter = Vec::new();
        let mut claimed = Vec::new();
        for (stream_id, outcome) in outcomes {
            match outcome {
                Redelivery::Claimed { deliveries, entry } => match self.build(entry, deliveries) {
                    Built::Out(out) => claimed.push(out),
                    Built::DeadLetter(order) => to_dead_letter.push(order),
                    Built::Nothing => {}
                },
                outcome => to_dead_letter.extend(self.ledger.redelivered(stream_id, outcome, now, now_unix_ms)),
            }
        }
        // Claimed again (reclaimed, recovered, retried): a keyed entry
        // passes the gate before any call gets it.
        self.gate_and_offer(claimed).await;
        if !to_dead_letter.is_empty() {
            self.dead_letter(to_dead_letter).await;
        }
    }

    /// Gives released deliveries back to the group (`release.lua`). On
    /// failure the Releases are answered UNAVAILABLE and the entries wait
    /// here, still pending with their count, and come back (counting an
    /// attempt) after the pause.
    async fn release(&mut self, orders: Vec<ReleaseOrder>) {
        self.act();
        let ids: Vec<StreamId> = orders.iter().map(|order| order.stream_id).collect();
        match release::release(&self.keys, &ids).await {
            Ok(outcomes) => {
                self.pacing.succeeded(Step::Release);
                self.ledger.released(orders, outcomes, Instant::now());
            }
            Err(e) => {
                self.redis_failed(Step::Release, &e);
                let message = format!("releasing failed ({e}); the entry stays pending for this sidecar and will be delivered again, as another attempt");
                let entries = orders.into_iter().map(|order| (order.stream_id, order.answer));
                self.ledger.not_written(entries, &message, self.pacing.paused_until());
            }
        }
    }

    /// XACKs and retry states, as one `settle.lua` run.
    async fn settle(&mut self, acks: Vec<PendingAck>, writes: Vec<RetryWrite>) {
        self.act();
        let links = self.outlet.take_ack_links(&acks);
        match settle::settle(&self.keys, &acks, &writes, links).await {
            Ok(pending) => {
                self.pacing.succeeded(Step::Settle);
                if let Some(shortfall) = self.ledger.acked(acks, &pending) {
                    self.log_shortfall(shortfall);
                }
            }
            Err(e) => {
                // The retry delays stay local.
                self.redis_failed(Step::Settle, &e);
                let message = if e.is_timeout() {
                    format!("XACK's outcome is unknown: Redis did not answer in time ({e}); if it was applied the entry is done, else it stays pending and will be delivered again")
                } else {
                    format!("XACK failed ({e}); the entry stays pending and will be delivered again")
                };
                let entries = acks.into_iter().map(|ack| (ack.stream_id, Some((ack.session, ack.text))));
                self.ledger.not_written(entries, &message, self.pacing.paused_until());
            }
        }
    }
}

// AckEmit: the rules applied to [`ack_emit`]'s outcomes.
impl Worker {
    /// Runs each AckEmit's script, all at once (through the durable writer
    /// they share one `WAIT`), and feeds each outcome back. A WRONGTYPE (an
    /// emit stream, or the retry hash, of another type: the script checks
    /// before its first write) wrote nothing and is no fault of Redis': see
    /// [`Ledger::emit_refused`]. Any other failure
    /// leaves the outcome unknown when the connection broke: the entry
    /// waits, and comes back only if the step did not apply.
    async fn ack_emit(&mut self, orders: Vec<EmitOrder>) {
        self.act();
        let parents: Vec<_> = orders.iter().map(|order| self.outlet.take_emit_parent(order.stream_id)).collect();
        let (keys, durable) = (&self.keys, self.shared.durable.as_ref());
        let steps = orders.iter().zip(parents).map(|(order, parent)| ack_emit::ack_emit(keys, durable, order, parent));
        let outcomes = futures_util::future::join_all(steps).await;
        for (order, outcome) in orders.into_iter().zip(outcomes) {
            match outcome {
                Ok(outcome) => {
                    self.pacing.succeeded(Step::AckEmit);
                    self.ledger.emitted(order, outcome);
                }
                Err(e) if e.code() == Some("WRONGTYPE") => {
                    let reason = format!("Redis refused the step: {e}");
                    self.ledger.emit_refused(order, reason, Instant::now());
                }
                Err(e) => {
                    self.redis_failed(Step::AckEmit, &e);
                    let message = if crate::error::is_transient(&e) {
                        format!("the AckEmit's outcome is unknown ({e}): if it was applied the entry is done and its emits are written, else nothing was and the entry will be delivered again")
                    } else {
                        format!("the AckEmit failed ({e}); nothing was written or acknowledged, and the entry will be delivered again")
                    };
                    let entry = (order.stream_id, Some((order.session, order.text)));
                    self.ledger.not_written([entry], &message, self.pacing.paused_until());
                }
            }
        }
    }
}

// Leases: the rules applied to [`lease`]'s outcomes.
impl Worker {
    /// The lease refresh beat (see [`lease`](super::lease)).
    async fn refresh_leases(&mut self) {
        if !self.redis_usable() {
            return;
        }
        for chunk in self.ledger.leased().chunks(BATCH_MAX) {
            self.act();
            let unrefreshed = match lease::refresh(&self.keys, chunk).await {
                Ok(unrefreshed) => unrefreshed,
                Err(e) => return self.redis_failed(Step::RefreshLeases, &e),
            };
            self.pacing.succeeded(Step::RefreshLeases);
            self.ledger.refreshed(chunk.len(), unrefreshed);
        }
    }

    /// The reclaim beat (see [`lease`](super::lease)).
    async fn reclaim(&mut self) {
        if !self.redis_usable() || self.ledger.draining() {
            return;
        }
        for _ in 0..RECLAIM_PAGES_PER_BEAT {
            self.act();
            let count = self.ledger.reclaim_room().min(BATCH_MAX);
            if count == 0 {
                return;
            }
            let page = match lease::reclaim(&self.keys, self.shared.reclaim_min_idle, self.reclaim_cursor, count).await
            {
                Ok(page) => page,
                Err(e) => return self.redis_failed(Step::Reclaim, &e),
            };
            self.pacing.succeeded(Step::Reclaim);
            let taken = self.ledger.reclaimed(&page.claimed, &page.deleted, Instant::now());
            if taken > 0 {
                info!(stream = %self.keys.stream, group = %self.keys.group, taken, "reclaimed idle entries");
            }
            self.reclaim_cursor = page.next;
            if page.next == StreamId::ZERO {
                return;
            }
        }
    }
}

// Recovery: the rules applied to [`recovery`]'s outcomes.
impl Worker {
    /// The primary switched: the new one may hold this consumer's PEL
    /// otherwise than the worker last saw it (an asynchronous replica had not
    /// yet received the last reads or acks), so the own PEL is walked again,
    /// as at start, and a pause for the old primary's errors ends now.
    fn after_primary_switch(&mut self) {
        info!(stream = %self.keys.stream, group = %self.keys.group, "the Redis primary switched; recovering own pending entries from the new one");
        self.ledger.recover_own_pending();
        self.pacing.restart(Instant::now());
    }

    async fn recreate_group(&mut self) -> bool {
        self.act();
        let created = match recovery::recreate_group(&self.keys).await {
            Ok(created) => created,
            Err(e) => {
                self.redis_failed(Step::RecreateGroup, &e);
                return false;
            }
        };
        let (stream, group) = (&self.keys.stream, &self.keys.group);
        let line = if created { "group re-created from the start of the stream" } else { "group exists again" };
        log_limited!(self.shared.recreation_log, line; %stream, %group);
        self.pacing.succeeded(Step::RecreateGroup);
        self.outlet.metrics.group_recreations.inc();
        self.group_lost = false;
        self.reclaim_cursor = StreamId::ZERO;
        // A shared reader waits for the stream to change; re-created from 0,
        // the group has entries to read that no change announces.
        if let Some(reader) = &self.reader {
            reader.kick();
        }
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
    fn recover_after_lost_read(&mut self) {
        if self.ledger.recover_own_pending() {
            debug!(stream = %self.keys.stream, group = %self.keys.group, "a read's reply was lost; recovering own pending entries before the next read");
        }
    }

    /// Reads one page of this consumer's own PEL and queues the entries for
    /// re-delivery, in stream order.
    async fn recover_page(&mut self, after: Option<StreamId>, count: usize) {
        self.act();
        let ids = match recovery::own_pending_page(&self.keys, after, count).await {
            Ok(ids) => ids,
            Err(e) => return self.redis_failed(Step::Recover, &e),
        };
        self.pacing.succeeded(Step::Recover);
        let Some(entries) = self.ledger.recovered_page(&ids, count, Instant::now()) else { return };
        if entries > 0 {
            info!(stream = %self.keys.stream, group = %self.keys.group, entries, "recovered own pending entries; reading new ones");
        } else {
            debug!(stream = %self.keys.stream, group = %self.keys.group, "no own pending entries to recover; reading new ones");
        }
    }
}

// Hygiene: the rules applied to [`hygiene`]'s outcomes.
impl Worker {
    /// The hygiene beat (see [`hygiene`](super::hygiene)).
    async fn hygiene(&mut self) {
        if !self.redis_usable() {
            return;
        }
        self.act();
        let (stream, group) = (&self.keys.stream, &self.keys.group);
        let limit = self.shared.consumer_idle_limit;
        let thorough = self.hygiene_beats.is_multiple_of(hygiene::thorough_every(limit));
        let beat = hygiene::beat(&self.keys, limit, thorough).await;
        if beat.is_ok() {
            self.pacing.succeeded(Step::Hygiene);
            self.hygiene_beats += 1;
        }
        match beat {
            Ok(hygiene::Beat::StreamGone) => {
                if !self.stream_gone {
                    warn!(%stream, %group, "stream `{stream}` no longer exists: it was deleted (DEL, FLUSHALL, or a Redis restart without persistence), and group `{group}` and its pending entries with it; consumer hygiene waits for it to come back (a call that subscribes re-creates it)");
                    self.stream_gone = true;
                }
            }
            Ok(hygiene::Beat::Done { removed, sidecars }) => {
                if std::mem::take(&mut self.stream_gone) {
                    info!(%stream, %group, "stream `{stream}` exists again; consumer hygiene resumes");
                }
                if !removed.is_empty() {
                    info!(%stream, %group, ?removed, "removed dead consumers that held nothing")
                }
                self.demand.sidecars = sidecars;
                self.outlet.metrics.group_sidecars.set(sidecars as i64);
                self.measure_reads(Instant::now());
                self.switch_reader_soon();
            }
            Err(e) => self.redis_failed(Step::Hygiene, &e),
        }
    }
}
