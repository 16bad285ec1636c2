//! The group worker: one task per (stream, group) in this sidecar, serving
//! every call subscribed to that pair under the sidecar's one consumer name.
//!
//! It owns the Redis side of consuming: the blocking reader, recovery of its own
//! PEL, the reclaim beat, lease refresh, and the XACK batches. It holds every
//! entry it knows about in exactly one state:
//!
//! - held: handed to a call, waiting for its verdict; idle time kept fresh;
//! - ready: read from Redis (delivery counted) but not yet handed over, because
//!   the call it was read for went away meanwhile;
//! - waiting: pending in this consumer's PEL, due for re-delivery at an instant
//!   (after a Fail, a disconnect, or found by recovery or the reclaim beat).
//!
//! Flow control is credit: the worker never has more entries read, ready or
//! being claimed than its calls have free `max_in_flight` slots, so its memory
//! is bounded by its calls' credit whatever the backlog in Redis.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use prost::Message;
use redis::{RedisError, Value};
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
    time::{interval, sleep_until, Instant, MissedTickBehavior},
};
use tracing::{debug, info, warn};

use super::{
    delivery::{self, Outgoing},
    Shared,
};
use crate::{
    error::Error,
    id::{BrandedId, StreamId},
    metrics::GroupMetrics,
    proto::{Delivery, VerdictError, VerdictErrorCode},
    redis::{array, parse_entry, parse_read_reply, parse_stream_id},
    telemetry,
};

/// Why XACK found nothing to acknowledge.
const NOT_PENDING_IN_GROUP: &str = "Redis no longer has this entry pending for the group: another client acknowledged it (a peer that reclaimed it, say), it was deleted, or the group was re-created; nothing was acknowledged";

/// Why a held entry cannot be settled: it was deleted from the stream.
const TRIMMED_WHILE_HELD: &str = "the entry was deleted from the stream while held (trimmed, XDEL, or lost with Redis' data); Redis dropped it from the PEL, so there is nothing to acknowledge, retry or dead-letter";

/// The verdict error for an id the call does not hold.
pub(crate) const UNKNOWN_ID: &str = "this call does not hold that id: it was never delivered to this call, was already settled, or passed its ack deadline";

/// Identifies one Consume call inside the sidecar.
pub(crate) type SessionId = u64;

/// The most entries one XREADGROUP or claim asks for.
const BATCH_MAX: usize = 512;
/// How many XAUTOCLAIM pages one reclaim beat may walk.
const RECLAIM_PAGES_PER_BEAT: usize = 8;
/// Room left in a frame for the ConsumeResponse wrapper around a Delivery (bytes).
const FRAME_OVERHEAD: usize = 16;
/// Pending entries scanned for the highest delivery count when polling metrics.
const METRICS_PENDING_SCAN: usize = 1_000;
/// How often held entries are checked against their ack deadlines.
const DEADLINE_CHECK: Duration = Duration::from_millis(100);
/// Bounds of the pause after a failed Redis command.
const REDIS_BACKOFF_MIN: Duration = Duration::from_millis(100);
const REDIS_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// A call's subscription settings, validated.
#[derive(Clone, Debug)]
pub(crate) struct Policy {
    /// Most entries the call holds un-settled.
    pub(crate) max_in_flight: u32,
    /// How long a delivery may stay un-settled; `None`: as long as the call lives.
    pub(crate) ack_deadline: Option<Duration>,
    /// First retry delay; doubled per attempt.
    pub(crate) backoff_initial: Duration,
    /// Cap of the retry delay.
    pub(crate) backoff_max: Duration,
}

/// Settings of the whole group on this sidecar: every call on it must agree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GroupPolicy {
    /// Deliveries after which an entry is dead-lettered instead of handed out; 0: no limit.
    pub(crate) max_deliveries: u32,
    /// Where poison entries and Fails with `dead_letter` go.
    pub(crate) dead_letter_stream: String,
}

impl Policy {
    /// The retry delay after `attempts` deliveries: `initial × 2^(attempts-1)`,
    /// capped, then jittered into its upper half so that entries failed together
    /// do not come back together.
    fn retry_delay(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(30);
        let full = self.backoff_initial.saturating_mul(1 << doublings).min(self.backoff_max);
        let half = full / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

/// What a call tells its worker.
#[derive(Debug)]
pub(crate) enum Command {
    /// A new call subscribed; deliveries and verdict errors go to `events`,
    /// deliveries marked with `shard` (the index of this worker's stream among
    /// the call's shards; 0 for a plain stream). Answered with an error when
    /// `group` conflicts with the group's calls.
    Attach {
        session: SessionId,
        shard: usize,
        policy: Policy,
        group: GroupPolicy,
        events: mpsc::UnboundedSender<Event>,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    /// Acknowledge these deliveries (the client's text and the parsed id).
    Ack { session: SessionId, ids: Vec<(String, BrandedId)> },
    /// A delivery failed.
    Fail { session: SessionId, fail: FailVerdict },
    /// Push the ack deadline of these deliveries to now + `by`.
    Extend { session: SessionId, ids: Vec<(String, BrandedId)>, by: Duration },
    /// The client is stopping: hand this call nothing more.
    Drain { session: SessionId },
    /// The call ended; what it holds goes back to waiting.
    /// `flushed` is answered once the call's verdicts have reached Redis, so
    /// a call that ends OK has had its acks applied.
    Detach { session: SessionId, flushed: oneshot::Sender<()> },
}

/// A Fail, validated.
#[derive(Debug)]
pub(crate) struct FailVerdict {
    /// The id as the client sent it, for verdict errors.
    pub(crate) text: String,
    pub(crate) id: BrandedId,
    /// Overrides the subscription's backoff.
    pub(crate) retry_after: Option<Duration>,
    /// Move to the dead-letter stream now.
    pub(crate) dead_letter: bool,
    /// Kept as the entry's last failure reason.
    pub(crate) reason: String,
}

/// What the worker tells a call. The channel is unbounded, but what flows on it
/// is bounded: deliveries by the call's credit, verdict errors by the verdicts
/// the call sent (and a call does not read new verdicts while it is blocked
/// sending to its client).
#[derive(Debug)]
pub(crate) enum Event {
    /// Hand this to the client: the delivery of `id` from the call's shard `shard`.
    Delivery { shard: usize, id: BrandedId, delivery: Delivery },
    /// A verdict that was not applied.
    VerdictError(VerdictError),
    /// The call no longer holds `id` from shard `shard`: its ack deadline
    /// passed (`gone` is `None`; a later verdict is answered UNKNOWN_ID), or
    /// Redis no longer has it pending for this sidecar (a later verdict is
    /// answered NOT_PENDING, saying why).
    Released { shard: usize, id: BrandedId, gone: Option<Gone> },
}

/// A delivery held by a call.
#[derive(Debug)]
struct Held {
    stream_id: StreamId,
    attempts: u32,
    deadline: Option<Instant>,
    /// When it was handed over, for the handler-time histogram.
    delivered_at: Instant,
    /// The delivery's span, from hand-over to verdict (only while traces are
    /// exported); it ends when this is dropped.
    span: Option<tracing::Span>,
}

/// Why a held entry is no longer pending for this sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gone {
    /// A peer reclaimed it (its lease ran out here).
    ToPeer,
    /// It was deleted from the stream (trimmed, XDEL) and dropped from the PEL.
    Deleted,
}

impl Gone {
    /// The NOT_PENDING message for a verdict on such an entry.
    pub(crate) fn message(self) -> &'static str {
        match self {
            Gone::ToPeer => {
                "the lease on this entry was lost to a peer, which may be handling it now; its verdict was not applied"
            }
            Gone::Deleted => TRIMMED_WHILE_HELD,
        }
    }
}

struct Session {
    /// This worker's stream's index among the call's shards.
    shard: usize,
    policy: Policy,
    events: mpsc::UnboundedSender<Event>,
    held: HashMap<BrandedId, Held>,
    /// The call's receiver is gone (its Detach is on the way), or the client
    /// asked to drain: it takes nothing more.
    closed: bool,
}

impl Held {
    fn record_verdict(&self, verdict: &str) {
        if let Some(span) = &self.span {
            span.record("verdict", verdict);
        }
    }
}

impl Session {
    fn free(&self) -> usize {
        if self.closed {
            return 0;
        }
        (self.policy.max_in_flight as usize).saturating_sub(self.held.len())
    }

    fn error(&self, id: &str, code: VerdictErrorCode, message: impl Into<String>) {
        let _ = self.events.send(Event::VerdictError(VerdictError {
            id: id.to_owned(),
            code: code as i32,
            message: message.into(),
        }));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Track {
    Held(SessionId),
    Ready,
    Waiting(Instant),
}

/// A queued XACK, applied at the end of the current batch of commands.
struct PendingAck {
    session: SessionId,
    text: String,
    stream_id: StreamId,
    /// The entry was delivered before, so the group's retry hash may hold it.
    redelivered: bool,
}

/// A queued retry-hash write: when a waiting entry is due and why it failed,
/// kept in Redis so the delay survives a restart and binds peers too.
struct RetryWrite {
    stream_id: StreamId,
    due_unix_ms: u64,
    reason: String,
}

/// One group's worker. Built by [`Worker::spawn`].
pub(crate) struct Worker {
    stream: String,
    group: String,
    shared: Arc<Shared>,
    metrics: GroupMetrics,
    sessions: HashMap<SessionId, Session>,
    entries: HashMap<StreamId, Track>,
    waiting: BTreeSet<(Instant, StreamId)>,
    ready: VecDeque<Outgoing>,
    acks: Vec<PendingAck>,
    retry_writes: Vec<RetryWrite>,
    /// Calls waiting for the next flush before they end.
    flushed: Vec<oneshot::Sender<()>>,
    /// The group's settings, set by the first call and shared by the others.
    policy: Option<GroupPolicy>,
    /// `<stream>:retries:<group>`, the group's retry hash.
    retries_key: String,
    /// At-most-once: reads with NOACK, nothing is pending, verdicts only free credit.
    no_ack: bool,
    /// While recovering its own PEL: the last id seen (`None`: from the start).
    recovering: Option<Option<StreamId>>,
    /// Entries requested from the reader and not yet returned.
    read_outstanding: usize,
    /// The blocking reader, while there are calls to read for.
    reader: Option<Reader>,
    reclaim_cursor: StreamId,
    /// Entries found deleted while pending since the last log line, so a
    /// trim of many pending entries is logged once with their count.
    trimmed_unlogged: u64,
    /// The group is gone (NOGROUP): re-create it before anything else.
    group_lost: bool,
    /// No Redis command from the pump before this instant (backoff after errors).
    paused_until: Instant,
    backoff: Duration,
    draining: bool,
}

impl Worker {
    /// Starts the worker and its reader for `stream` and `group`, and returns
    /// the sender of its commands. The worker ends when every sender is dropped.
    pub(crate) fn spawn(
        shared: Arc<Shared>,
        stream: String,
        group: String,
        no_ack: bool,
    ) -> (mpsc::Sender<Command>, JoinHandle<()>) {
        let (commands_tx, commands) = mpsc::channel(1024);
        let draining = *shared.draining.borrow();
        let retries = shared.redis.keys.retries(&stream, &group);
        let worker = Worker {
            metrics: shared.metrics.group(&stream, shared.redis.keys.sharded_stream_of(&stream), &group),
            stream,
            group,
            shared,
            sessions: HashMap::new(),
            entries: HashMap::new(),
            waiting: BTreeSet::new(),
            ready: VecDeque::new(),
            acks: Vec::new(),
            retry_writes: Vec::new(),
            flushed: Vec::new(),
            policy: None,
            retries_key: retries,
            no_ack,
            // Nothing of an at-most-once reader is ever pending: nothing to recover.
            recovering: if no_ack { None } else { Some(None) },
            read_outstanding: 0,
            reader: None,
            reclaim_cursor: StreamId::ZERO,
            trimmed_unlogged: 0,
            group_lost: false,
            paused_until: Instant::now(),
            backoff: REDIS_BACKOFF_MIN,
            draining,
        };
        (commands_tx, tokio::spawn(worker.run(commands)))
    }

    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut draining = self.shared.draining.clone();
        let mut refresh = interval(self.shared.lease_refresh);
        let mut reclaim = interval(self.shared.reclaim_interval);
        let mut deadlines = interval(DEADLINE_CHECK);
        // Often enough to notice within about a quarter of the limit, rarely enough to cost nothing.
        let mut poll = interval(self.shared.metrics_poll.unwrap_or(Duration::from_secs(3600)));
        let mut hygiene = interval(
            self.shared
                .consumer_idle_limit
                .map_or(Duration::from_secs(3600), |limit| (limit / 4).max(Duration::from_secs(1))),
        );
        for tick in [&mut refresh, &mut reclaim, &mut deadlines, &mut hygiene, &mut poll] {
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        }
        info!(stream = %self.stream, group = %self.group, consumer = %self.shared.consumer, "group worker started");
        loop {
            if !self.draining {
                self.pump().await;
            }
            let wake = self.next_wake();
            tokio::select! {
                command = commands.recv() => {
                    let Some(command) = command else { break };
                    self.handle(command).await;
                    // Take whatever else is queued, so acks go out as one pipeline.
                    for _ in 0..1024 {
                        match commands.try_recv() {
                            Ok(command) => self.handle(command).await,
                            Err(_) => break,
                        }
                    }
                    self.flush().await;
                }
                result = next_read(&mut self.reader) => self.on_read(result).await,
                _ = sleep_until(wake) => {}
                _ = refresh.tick() => self.refresh_leases().await,
                _ = reclaim.tick() => self.reclaim().await,
                _ = deadlines.tick(), if self.has_deadlines() => {
                    self.expire_deadlines();
                    // Their retry delays go to Redis now, to bind peers and
                    // outlive a restart, not with the next verdict.
                    self.flush().await;
                }
                _ = poll.tick(), if self.shared.metrics_poll.is_some() => self.poll_metrics().await,
                _ = hygiene.tick(), if self.shared.consumer_idle_limit.is_some() => self.forget_dead_consumers().await,
                Ok(()) = draining.changed() => {
                    self.draining = *draining.borrow();
                    if self.draining {
                        self.stop_reading();
                    }
                }
            }
            self.log_trimmed();
        }
        self.flush().await;
        self.stop_reading();
        info!(stream = %self.stream, group = %self.group, "group worker stopped");
    }

    /// Cuts off the blocked XREADGROUP (its connection is dropped), so no
    /// entry appended meanwhile is taken with no call to hand it to: on
    /// shutdown, and when the last call leaves.
    fn stop_reading(&mut self) {
        if let Some(reader) = self.reader.take() {
            reader.task.abort();
        }
        self.read_outstanding = 0;
    }

    /// Asks the reader (started if need be) for `count` new entries.
    fn read(&mut self, count: usize) {
        let reader = self.reader.get_or_insert_with(|| {
            Reader::spawn(self.shared.clone(), self.stream.clone(), self.group.clone(), self.no_ack)
        });
        if reader.requests.try_send(count).is_ok() {
            self.read_outstanding = count;
        }
    }

    fn next_wake(&self) -> Instant {
        let far = Instant::now() + Duration::from_secs(3600);
        if self.draining {
            return far;
        }
        // After a failed command, the pump retries at the end of the pause.
        if self.paused() && (self.free() > 0 || self.group_lost) {
            return self.paused_until;
        }
        if self.free_for_due() == 0 {
            return far;
        }
        self.waiting.first().map_or(far, |(at, _)| *at).min(far)
    }

    /// Free credit: slots the calls have minus entries already on their way.
    fn free(&self) -> usize {
        self.free_for_due().saturating_sub(self.read_outstanding)
    }

    /// Credit for due re-deliveries: the blocking read's share is not counted,
    /// or an idle stream's read would hold a due retry back for up to its
    /// BLOCK time. Entries that read then returns wait as ready, so memory
    /// stays bounded by twice the credit.
    fn free_for_due(&self) -> usize {
        let slots: usize = self.sessions.values().map(Session::free).sum();
        slots.saturating_sub(self.ready.len())
    }

    fn paused(&self) -> bool {
        Instant::now() < self.paused_until
    }

    fn redis_failed(&mut self, what: &str, error: &RedisError) {
        self.shared.metrics.redis_error(what);
        if is_group_lost(error) {
            if !self.group_lost {
                warn!(stream = %self.stream, group = %self.group, "the group is gone ({error}); re-creating it");
            }
            self.group_lost = true;
        } else {
            warn!(stream = %self.stream, group = %self.group, "{what} failed, retrying in {:?}: {error}", self.backoff);
        }
        self.paused_until = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(REDIS_BACKOFF_MAX);
    }

    fn redis_ok(&mut self) {
        self.backoff = REDIS_BACKOFF_MIN;
    }

    /// Moves work forward while there is credit: ready entries first, then due
    /// re-deliveries, then recovery of the own PEL, then a new read.
    async fn pump(&mut self) {
        self.hand_out_ready();
        if self.paused() {
            return;
        }
        if self.group_lost && !self.recreate_group().await {
            return;
        }
        loop {
            if self.paused() {
                return;
            }
            let now = Instant::now();
            let due: Vec<(Instant, StreamId)> = self
                .waiting
                .iter()
                .take_while(|(at, _)| *at <= now)
                .take(self.free_for_due().min(BATCH_MAX))
                .copied()
                .collect();
            if !due.is_empty() {
                self.redeliver(due).await;
                continue;
            }
            let free = self.free();
            if free == 0 {
                return;
            }
            if let Some(after) = self.recovering {
                self.recover_page(after, free.min(BATCH_MAX)).await;
                continue;
            }
            break;
        }
        if self.read_outstanding == 0 {
            let count = self.free().min(BATCH_MAX);
            if count > 0 {
                self.read(count);
            }
        }
    }

    /// Re-creates a lost group from the start of what the stream holds now.
    /// From `0`, not `$`: after a flush or a restart without persistence
    /// everything in the stream arrived after the group was lost, and skipping
    /// it would lose entries; re-delivering is the at-least-once side.
    async fn recreate_group(&mut self) -> bool {
        let mut conn = self.shared.redis.conn.clone();
        let result: Result<(), RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&self.stream)
            .arg(&self.group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await;
        match result {
            Ok(()) => {
                info!(stream = %self.stream, group = %self.group, "group re-created from the start of the stream")
            }
            Err(e) if e.code() == Some("BUSYGROUP") => {
                info!(stream = %self.stream, group = %self.group, "group exists again")
            }
            Err(e) => {
                self.redis_failed("re-creating the group", &e);
                return false;
            }
        }
        self.redis_ok();
        self.metrics.group_recreations.inc();
        self.group_lost = false;
        self.reclaim_cursor = StreamId::ZERO;
        true
    }

    fn hand_out_ready(&mut self) {
        while let Some(out) = self.ready.pop_front() {
            if let Some(out) = self.hand_out(out) {
                self.ready.push_front(out);
                break;
            }
        }
    }

    /// Hands one entry to the call with the most free credit that does not
    /// already hold an entry with the same branded id (so a verdict by branded
    /// id is never ambiguous). Gives the entry back when no call can take it.
    fn hand_out(&mut self, out: Outgoing) -> Option<Outgoing> {
        let target = self
            .sessions
            .iter()
            .filter(|(_, s)| s.free() > 0 && !s.held.contains_key(&out.branded))
            .max_by_key(|(_, s)| s.free())
            .map(|(id, _)| *id);
        let Some(session_id) = target else { return Some(out) };
        let session = self.sessions.get_mut(&session_id).expect("picked from the map");
        let Outgoing { stream_id, branded, mut delivery } = out;
        let attempts = delivery.attempts;
        let span = telemetry::exporting().then(|| {
            let span = tracing::info_span!(
                "echomq.deliver",
                stream = %self.stream,
                group = %self.group,
                stream_id = %stream_id,
                id = %branded,
                attempts,
                verdict = tracing::field::Empty,
            );
            telemetry::set_parent(&span, Some(&delivery.traceparent).filter(|t| !t.is_empty()).map(String::as_str));
            if let Some(traceparent) = telemetry::traceparent_of(&span) {
                delivery.traceparent = traceparent;
            }
            span
        });
        let event = Event::Delivery { shard: session.shard, id: branded, delivery };
        if let Err(mpsc::error::SendError(Event::Delivery { delivery, .. })) = session.events.send(event) {
            session.closed = true;
            return Some(Outgoing { stream_id, branded, delivery });
        }
        let deadline = session.policy.ack_deadline.map(|d| Instant::now() + d);
        session.held.insert(branded, Held { stream_id, attempts, deadline, delivered_at: Instant::now(), span });
        self.entries.insert(stream_id, Track::Held(session_id));
        self.shared.held.fetch_add(1, Ordering::Relaxed);
        self.metrics.deliveries.inc();
        self.metrics.in_flight.inc();
        None
    }

    /// Keeps an entry that could not be handed out for the next free call; with
    /// no call at all, releases it to wait in the PEL (see [`Self::release_ready`]).
    fn keep_ready(&mut self, out: Outgoing) {
        if self.sessions.is_empty() {
            return self.wait(out.stream_id, Instant::now());
        }
        self.entries.insert(out.stream_id, Track::Ready);
        self.ready.push_back(out);
    }

    fn wait(&mut self, stream_id: StreamId, at: Instant) {
        if let Some(Track::Waiting(old)) = self.entries.insert(stream_id, Track::Waiting(at)) {
            self.waiting.remove(&(old, stream_id));
        }
        self.waiting.insert((at, stream_id));
    }

    /// Schedules a failed entry's re-delivery after `delay`, here and, through
    /// the group's retry hash, for a peer that reclaims it or for this sidecar
    /// after a restart.
    fn retry_later(&mut self, stream_id: StreamId, delay: Duration, reason: String) {
        if self.no_ack {
            return;
        }
        self.metrics.fails.inc();
        self.wait(stream_id, Instant::now() + delay);
        let due_unix_ms = crate::entry::now_unix_ms().saturating_add(delay.as_millis() as u64);
        self.retry_writes.push(RetryWrite { stream_id, due_unix_ms, reason });
    }

    /// `own_pending.lua` prepared for `mode` on this group; the caller adds the ids.
    fn own_pending(&self, mode: &str, fifth: impl redis::ToRedisArgs) -> redis::ScriptInvocation<'_> {
        let dead_letter_stream = self
            .policy
            .as_ref()
            .map_or_else(|| self.shared.redis.keys.dead_letter_stream(&self.stream), |p| p.dead_letter_stream.clone());
        let mut script = self.shared.redis.scripts.own_pending.prepare_invoke();
        script
            .key(&self.stream)
            .key(dead_letter_stream)
            .key(&self.retries_key)
            .arg(&self.group)
            .arg(&self.shared.consumer)
            .arg(mode)
            .arg(&self.shared.id_field)
            .arg(fifth);
        script
    }

    /// Claims due entries that are still this consumer's and hands them out;
    /// dead-letters those that reached `max_deliveries`.
    async fn redeliver(&mut self, due: Vec<(Instant, StreamId)>) {
        for key in &due {
            self.waiting.remove(key);
            self.entries.remove(&key.1);
        }
        let max_deliveries = self.policy.as_ref().map_or(0, |p| p.max_deliveries);
        let mut script = self.own_pending("deliver", max_deliveries);
        for (_, id) in &due {
            script.arg(id.to_string());
        }
        let mut conn = self.shared.redis.conn.clone();
        let reply: Value = match script.invoke_async(&mut conn).await {
            Ok(reply) => reply,
            Err(e) => {
                self.redis_failed("re-delivering pending entries", &e);
                let retry_at = self.paused_until;
                for (_, id) in due {
                    self.wait(id, retry_at);
                }
                return;
            }
        };
        self.redis_ok();
        for item in array(&reply) {
            let parts = array(item);
            let (Some(id), Some(Value::Int(code))) = (parts.first(), parts.get(1)) else { continue };
            let Ok(stream_id) = parse_stream_id(id) else { continue };
            match *code {
                -1 => debug!(stream = %self.stream, %stream_id, "no longer pending for this consumer; a peer took it"),
                0 => self.trimmed_while_pending(stream_id),
                -2 => {
                    let due_unix_ms = match parts.get(2) {
                        Some(Value::Int(ms)) => *ms as u64,
                        _ => 0,
                    };
                    let delay = Duration::from_millis(due_unix_ms.saturating_sub(crate::entry::now_unix_ms()));
                    self.wait(stream_id, Instant::now() + delay);
                }
                -3 => self.dead_lettered(stream_id, parts.get(2), parts.get(3), "max deliveries reached"),
                count => {
                    let entry = parts.get(2).and_then(|f| parse_entry(&Value::Array(vec![id.clone(), f.clone()])).ok());
                    let Some(entry) = entry else { continue };
                    self.dispatch(entry, u32::try_from(count).unwrap_or(u32::MAX)).await;
                }
            }
        }
    }

    fn dead_lettered(&mut self, stream_id: StreamId, dead_id: Option<&Value>, deliveries: Option<&Value>, why: &str) {
        self.entries.remove(&stream_id);
        self.metrics.dead_letters.inc();
        let dead_id = dead_id.and_then(|v| parse_stream_id(v).ok()).map(|id| id.to_string()).unwrap_or_default();
        let deliveries = match deliveries {
            Some(Value::Int(n)) => *n,
            _ => 0,
        };
        let dead_letter_stream = self.policy.as_ref().map(|p| p.dead_letter_stream.as_str()).unwrap_or_default();
        warn!(stream = %self.stream, group = %self.group, %stream_id, deliveries, %dead_letter_stream, %dead_id, "entry dead-lettered: {why}");
    }

    async fn dispatch(&mut self, entry: crate::redis::RawEntry, attempts: u32) {
        let stream_id = entry.id;
        if entry.fields.is_none() {
            return self.trimmed_while_pending(stream_id);
        }
        if matches!(self.entries.get(&stream_id), Some(Track::Held(_))) {
            // A re-created group (after NOGROUP) reads again what a call still
            // holds: the call's verdict settles it, it is not handed out twice.
            return;
        }
        match delivery::from_raw(&self.stream, &self.group, &self.shared.id_field, entry, attempts) {
            // A frame the client could not receive would end its call (and the
            // next, and the next): such an entry goes to the dead-letter stream.
            Some(out) if out.delivery.encoded_len() + FRAME_OVERHEAD > self.shared.max_message_bytes => {
                let reason = format!(
                    "the entry is {} bytes, over the sidecar's --max-message-bytes ({})",
                    out.delivery.encoded_len(),
                    self.shared.max_message_bytes
                );
                self.dead_letter_now(stream_id, reason).await;
            }
            // While draining, a read that was already under way hands nothing
            // out: its entries stay pending for the next run or a peer.
            Some(out) if self.draining => self.keep_ready(out),
            Some(out) => {
                if let Some(out) = self.hand_out(out) {
                    self.keep_ready(out);
                }
            }
            None => warn!(
                stream = %self.stream, %stream_id,
                "entry has no branded id (its milliseconds exceed 6 bytes); it stays pending"
            ),
        }
    }

    /// The entry was deleted from the stream and Redis dropped it from the PEL
    /// (XAUTOCLAIM's deleted ids, a nil body in a PEL read): never forwarded,
    /// and if a call holds it, its verdict is answered NOT_PENDING.
    fn trimmed_while_pending(&mut self, stream_id: StreamId) {
        self.forget(stream_id, Gone::Deleted);
        self.metrics.trimmed_while_pending.inc();
        self.trimmed_unlogged += 1;
        debug!(stream = %self.stream, group = %self.group, %stream_id, "entry was deleted from the stream while pending");
    }

    fn log_trimmed(&mut self) {
        if self.trimmed_unlogged > 0 {
            let entries = std::mem::take(&mut self.trimmed_unlogged);
            warn!(stream = %self.stream, group = %self.group, entries, "entries were deleted from the stream while pending (trimmed, XDEL); dropped from the PEL, never delivered again");
        }
    }

    /// Reads one page of this consumer's own PEL (XPENDING … consumer) and
    /// queues the entries for re-delivery, in stream order.
    async fn recover_page(&mut self, after: Option<StreamId>, count: usize) {
        let start = after.map_or_else(|| "-".to_owned(), |id| format!("({id}"));
        let mut conn = self.shared.redis.conn.clone();
        let reply: Result<Value, RedisError> = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(start)
            .arg("+")
            .arg(count)
            .arg(&self.shared.consumer)
            .query_async(&mut conn)
            .await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => return self.redis_failed("recovering own pending entries", &e),
        };
        self.redis_ok();
        let items = array(&reply);
        let now = Instant::now();
        let mut last = after;
        for item in items {
            let Some(Ok(id)) = array(item).first().map(parse_stream_id) else { continue };
            last = Some(id);
            if !self.entries.contains_key(&id) {
                self.wait(id, now);
            }
        }
        if items.len() < count {
            info!(stream = %self.stream, group = %self.group, "recovered own pending entries; reading new ones");
            self.recovering = None;
        } else {
            self.recovering = Some(last);
        }
    }

    async fn on_read(&mut self, result: Result<Value, RedisError>) {
        self.read_outstanding = 0;
        let entries = match result.and_then(|reply| parse_read_reply(&reply)) {
            Ok(entries) => entries,
            Err(e) => return self.redis_failed("reading new entries", &e),
        };
        self.redis_ok();
        for entry in entries {
            // A `>` read hands each entry over for the first time: attempts 1.
            self.dispatch(entry, 1).await;
        }
    }

    async fn handle(&mut self, command: Command) {
        match command {
            Command::Attach { session, shard, policy, group, events, reply } => {
                let _ = reply.send(self.attach(session, shard, policy, group, events));
            }
            Command::Ack { session, ids } => {
                for (text, id) in ids {
                    self.ack(session, text, id);
                }
            }
            Command::Fail { session, fail } => self.fail(session, fail).await,
            Command::Extend { session, ids, by } => {
                let Some(s) = self.sessions.get_mut(&session) else { return };
                for (text, id) in ids {
                    match s.held.get_mut(&id) {
                        Some(held) => held.deadline = s.policy.ack_deadline.map(|_| Instant::now() + by),
                        None => s.error(&text, VerdictErrorCode::UnknownId, UNKNOWN_ID),
                    }
                }
            }
            Command::Drain { session } => {
                if let Some(s) = self.sessions.get_mut(&session) {
                    s.closed = true;
                }
            }
            Command::Detach { session, flushed } => {
                // The call's last verdicts first, so that their errors still
                // reach it (after a client closed its side, it still reads).
                self.flush_verdicts().await;
                self.detach(session);
                self.flushed.push(flushed);
            }
        }
    }

    /// Adds a call. The group's settings come from its first call; a later call
    /// that asks for others is refused rather than silently overruled.
    fn attach(
        &mut self,
        session: SessionId,
        shard: usize,
        policy: Policy,
        group: GroupPolicy,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<(), Error> {
        match &self.policy {
            Some(current) if *current != group && !self.sessions.is_empty() => {
                return Err(Error::Conflict {
                    reason: format!(
                        "group `{}` on stream `{}` already runs on this sidecar with max_deliveries {} and dead-letter stream `{}`; subscribe with the same settings",
                        self.group, self.stream, current.max_deliveries, current.dead_letter_stream
                    ),
                })
            }
            _ => self.policy = Some(group),
        }
        self.sessions.insert(session, Session { shard, policy, events, held: HashMap::new(), closed: false });
        Ok(())
    }

    /// Takes the delivery `id` out of the call's hands; answers the verdict
    /// error itself when the call does not hold it (or no longer holds the lease).
    fn settle(&mut self, session: SessionId, text: &str, id: BrandedId) -> Option<Held> {
        let s = self.sessions.get_mut(&session)?;
        let Some(held) = s.held.remove(&id) else {
            s.error(text, VerdictErrorCode::UnknownId, UNKNOWN_ID);
            return None;
        };
        self.shared.held.fetch_sub(1, Ordering::Relaxed);
        self.metrics.in_flight.dec();
        self.metrics.handler_seconds.observe(held.delivered_at.elapsed().as_secs_f64());
        self.entries.remove(&held.stream_id);
        Some(held)
    }

    fn ack(&mut self, session: SessionId, text: String, id: BrandedId) {
        let Some(held) = self.settle(session, &text, id) else { return };
        held.record_verdict("ack");
        if !self.no_ack {
            self.acks.push(PendingAck { session, text, stream_id: held.stream_id, redelivered: held.attempts > 1 });
        }
    }

    /// Sends the queued acks and retry-hash writes as one pipeline: an XACK
    /// per id (so the reply says which ids were still pending), an HDEL of the
    /// retry state of re-delivered ones, and the HSETs of new retry states.
    async fn flush(&mut self) {
        self.flush_verdicts().await;
        for call in self.flushed.drain(..) {
            let _ = call.send(());
        }
    }

    /// Sends the queued acks and retry-state writes as one `settle.lua` run:
    /// an XACK per id (so the reply says which ids were still pending), an
    /// HDEL of the retry state of re-delivered ones, the HSETs of new retry
    /// states. One command instead of a pipeline of many: Redis parses and
    /// dispatches one request per batch.
    async fn flush_verdicts(&mut self) {
        if self.acks.is_empty() && self.retry_writes.is_empty() {
            return;
        }
        let acks = std::mem::take(&mut self.acks);
        let writes = std::mem::take(&mut self.retry_writes);
        let mut script = self.shared.redis.scripts.settle.prepare_invoke();
        script.key(&self.stream).key(&self.retries_key).arg(&self.group).arg(acks.len());
        for ack in &acks {
            script.arg(ack.stream_id.to_string());
        }
        script.arg(acks.iter().filter(|a| a.redelivered).count());
        for ack in acks.iter().filter(|a| a.redelivered) {
            script.arg(ack.stream_id.to_string());
        }
        script.arg(writes.len());
        for write in &writes {
            script.arg(write.stream_id.to_string()).arg(format!("{} {}", write.due_unix_ms, write.reason));
        }
        let mut conn = self.shared.redis.conn.clone();
        match script.invoke_async::<Vec<i64>>(&mut conn).await {
            Ok(counts) => {
                self.redis_ok();
                for (ack, count) in acks.iter().zip(counts) {
                    if count == 1 {
                        self.metrics.acks.inc();
                    } else if let Some(s) = self.sessions.get(&ack.session) {
                        self.metrics.acks_not_pending.inc();
                        s.error(&ack.text, VerdictErrorCode::NotPending, NOT_PENDING_IN_GROUP);
                    }
                }
            }
            Err(e) => {
                // The acks are reported as not known to be applied; their
                // entries wait, and come back only if still pending (the
                // re-delivery checks), so an applied ack is not undone. The
                // retry delays stay local.
                self.redis_failed("acknowledging", &e);
                let message = if e.is_timeout() {
                    format!("XACK's outcome is unknown: Redis did not answer in time ({e}); if it was applied the entry is done, else it stays pending and will be delivered again")
                } else {
                    format!("XACK failed ({e}); the entry stays pending and will be delivered again")
                };
                let retry_at = self.paused_until;
                for ack in acks {
                    if let Some(s) = self.sessions.get(&ack.session) {
                        s.error(&ack.text, VerdictErrorCode::Unavailable, message.clone());
                    }
                    self.wait(ack.stream_id, retry_at);
                }
            }
        }
    }

    async fn fail(&mut self, session: SessionId, fail: FailVerdict) {
        let FailVerdict { text, id, retry_after, dead_letter, reason } = fail;
        let Some(s) = self.sessions.get(&session) else { return };
        if self.no_ack {
            // Refused, so nothing changes: the delivery stays held.
            s.error(&text, VerdictErrorCode::InvalidArgument, "this is an at-most-once (no_ack) subscription: the entry is not pending, so it cannot be retried or dead-lettered; ack it");
            return;
        }
        let policy = s.policy.clone();
        let Some(held) = self.settle(session, &text, id) else { return };
        held.record_verdict(if dead_letter { "dead_letter" } else { "fail" });
        if !dead_letter {
            let delay = retry_after.unwrap_or_else(|| policy.retry_delay(held.attempts));
            debug!(stream = %self.stream, stream_id = %held.stream_id, ?delay, %reason, "delivery failed; retrying after the delay");
            return self.retry_later(held.stream_id, delay, reason);
        }
        let mut script = self.own_pending("dead_letter", &reason);
        script.arg(held.stream_id.to_string());
        let mut conn = self.shared.redis.conn.clone();
        let result: Result<Value, RedisError> = script.invoke_async(&mut conn).await;
        let error = match result {
            Ok(reply) => {
                self.redis_ok();
                let parts = array(array(&reply).first().unwrap_or(&Value::Nil)).to_vec();
                match parts.get(1) {
                    Some(Value::Int(-3)) => {
                        self.dead_lettered(held.stream_id, parts.get(2), parts.get(3), &reason);
                        None
                    }
                    Some(Value::Int(0)) => {
                        self.trimmed_while_pending(held.stream_id);
                        Some((VerdictErrorCode::NotPending, TRIMMED_WHILE_HELD.to_owned()))
                    }
                    _ => Some((
                        VerdictErrorCode::NotPending,
                        "Redis no longer has this entry pending for this consumer; nothing was dead-lettered"
                            .to_owned(),
                    )),
                }
            }
            Err(e) => {
                self.redis_failed("dead-lettering", &e);
                let retry_at = self.paused_until;
                self.wait(held.stream_id, retry_at);
                Some((
                    VerdictErrorCode::Unavailable,
                    format!("dead-lettering failed ({e}); the entry stays pending and will be delivered again"),
                ))
            }
        };
        if let (Some((code, message)), Some(s)) = (error, self.sessions.get(&session)) {
            s.error(&text, code, message);
        }
    }

    /// Moves an entry this consumer holds to the dead-letter stream at once
    /// (`own_pending.lua`, dead-letter mode); on failure it waits and comes back.
    async fn dead_letter_now(&mut self, stream_id: StreamId, reason: String) {
        let mut script = self.own_pending("dead_letter", &reason);
        script.arg(stream_id.to_string());
        let mut conn = self.shared.redis.conn.clone();
        match script.invoke_async::<Value>(&mut conn).await {
            Ok(reply) => {
                let parts = array(array(&reply).first().unwrap_or(&Value::Nil)).to_vec();
                if let Some(Value::Int(-3)) = parts.get(1) {
                    self.dead_lettered(stream_id, parts.get(2), parts.get(3), &reason);
                }
            }
            Err(e) => {
                self.redis_failed("dead-lettering", &e);
                let retry_at = self.paused_until;
                self.wait(stream_id, retry_at);
            }
        }
    }

    /// A call ended: what it held waits for its backoff, as after a Fail.
    fn detach(&mut self, session: SessionId) {
        let Some(s) = self.sessions.remove(&session) else { return };
        let returned = s.held.len();
        self.shared.held.fetch_sub(returned, Ordering::Relaxed);
        if self.draining {
            self.shared.returned_while_draining.fetch_add(returned, Ordering::Relaxed);
        }
        self.metrics.in_flight.dec_by(returned as i64);
        for held in s.held.into_values() {
            self.entries.remove(&held.stream_id);
            let delay = s.policy.retry_delay(held.attempts);
            self.retry_later(held.stream_id, delay, "the call ended before a verdict".to_owned());
        }
        if returned > 0 && !self.no_ack {
            info!(stream = %self.stream, group = %self.group, returned, "call ended holding entries; they stay pending and will be delivered again");
        }
        if self.sessions.is_empty() {
            self.stop_reading();
            self.release_ready();
        }
    }

    /// With no call left, entries read for a call that went away stop being
    /// leased: they wait in the PEL like any other, so a peer with clients can
    /// reclaim them after the minimum idle time instead of this idle sidecar
    /// sitting on them. If a call comes back first, they are claimed again
    /// (which checks they are still this consumer's).
    fn release_ready(&mut self) {
        let now = Instant::now();
        while let Some(out) = self.ready.pop_front() {
            self.wait(out.stream_id, now);
        }
    }

    fn has_deadlines(&self) -> bool {
        self.sessions.values().any(|s| s.policy.ack_deadline.is_some() && !s.held.is_empty())
    }

    /// Deliveries past their ack deadline are treated as failed.
    fn expire_deadlines(&mut self) {
        let now = Instant::now();
        let mut expired = Vec::new();
        for s in self.sessions.values_mut() {
            let ids: Vec<BrandedId> =
                s.held.iter().filter(|(_, h)| h.deadline.is_some_and(|d| d <= now)).map(|(id, _)| *id).collect();
            for id in ids {
                if let Some(held) = s.held.remove(&id) {
                    let delay = s.policy.retry_delay(held.attempts);
                    expired.push((held, delay));
                    let _ = s.events.send(Event::Released { shard: s.shard, id, gone: None });
                }
            }
        }
        self.shared.held.fetch_sub(expired.len(), Ordering::Relaxed);
        self.metrics.in_flight.dec_by(expired.len() as i64);
        for (held, delay) in expired {
            debug!(stream = %self.stream, stream_id = %held.stream_id, "ack deadline passed; treated as failed");
            self.entries.remove(&held.stream_id);
            self.retry_later(held.stream_id, delay, "the ack deadline passed".to_owned());
        }
    }

    /// Keeps held and ready entries' idle time fresh (XCLAIM … JUSTID through
    /// `own_pending.lua`), so a peer's reclaim beat does not take them from a
    /// live handler, and learns which ones a peer took anyway.
    async fn refresh_leases(&mut self) {
        // While paused or without a group, a refresh can only fail again and
        // push the pause out, starving the pump that re-creates the group.
        if self.no_ack || self.group_lost || self.paused() {
            return;
        }
        let ids: Vec<StreamId> = self
            .entries
            .iter()
            .filter(|(_, track)| matches!(track, Track::Held(_) | Track::Ready))
            .map(|(id, _)| *id)
            .collect();
        for chunk in ids.chunks(BATCH_MAX) {
            let mut script = self.own_pending("refresh", 0);
            for id in chunk {
                script.arg(id.to_string());
            }
            let mut conn = self.shared.redis.conn.clone();
            let not_refreshed: Vec<Value> = match script.invoke_async::<Value>(&mut conn).await {
                Ok(reply) => array(&reply).to_vec(),
                Err(e) => return self.redis_failed("refreshing leases", &e),
            };
            self.metrics.lease_refreshes.inc_by((chunk.len() - not_refreshed.len()) as u64);
            for item in &not_refreshed {
                let parts = array(item);
                let Some(Ok(id)) = parts.first().map(parse_stream_id) else { continue };
                match parts.get(1) {
                    Some(Value::Int(0)) => self.trimmed_while_pending(id),
                    Some(Value::Int(-1)) => self.lease_lost(id),
                    // Pending for no one: a re-created group reads it again
                    // (and the call's verdict then applies), or another client
                    // acknowledged it (and the verdict is answered NOT_PENDING).
                    _ => {
                        debug!(stream = %self.stream, group = %self.group, stream_id = %id, "held entry is pending for no consumer")
                    }
                }
            }
        }
    }

    /// A peer took an entry this sidecar holds: the call is told now, and its
    /// later verdict is answered NOT_PENDING instead of being applied.
    fn lease_lost(&mut self, stream_id: StreamId) {
        let Some((session, id)) = self.forget(stream_id, Gone::ToPeer) else { return };
        let Some(s) = self.sessions.get(&session) else { return };
        self.metrics.leases_lost.inc();
        s.error(&id.to_string(), VerdictErrorCode::LeaseLost, "the lease on this entry was lost: Redis no longer has it pending for this sidecar (a peer reclaimed it); this call no longer holds it, and a verdict for it will not be applied");
        warn!(stream = %self.stream, group = %self.group, %stream_id, "lease lost: the entry is no longer pending for this consumer");
    }

    /// Stops tracking an entry Redis no longer has pending for this sidecar.
    /// A held one leaves its call (freeing its slot), which is told through a
    /// `Released` event so that its verdict is answered NOT_PENDING; returns
    /// that call and the delivery's id.
    fn forget(&mut self, stream_id: StreamId, gone: Gone) -> Option<(SessionId, BrandedId)> {
        match self.entries.remove(&stream_id)? {
            Track::Held(session) => {
                let s = self.sessions.get_mut(&session)?;
                let id = *s.held.iter().find(|(_, h)| h.stream_id == stream_id)?.0;
                s.held.remove(&id);
                self.shared.held.fetch_sub(1, Ordering::Relaxed);
                self.metrics.in_flight.dec();
                let _ = s.events.send(Event::Released { shard: s.shard, id, gone: Some(gone) });
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
        }
    }

    /// Sets the polled group gauges from the same reading as DescribeGroup.
    async fn poll_metrics(&mut self) {
        if self.no_ack || self.group_lost || self.paused() {
            return;
        }
        match crate::admin::describe(&self.shared.redis, &self.stream, &self.group, METRICS_PENDING_SCAN).await {
            Ok(state) => {
                let m = &self.metrics;
                m.pending.set(state.pending as i64);
                m.set_lag(state.lag);
                m.oldest_pending_age_seconds
                    .set(state.oldest_pending_age.map_or(0.0, |age| age.seconds as f64 + f64::from(age.nanos) / 1e9));
                m.max_delivery_count.set(state.max_delivery_count as i64);
                m.consumers.set(state.consumers.len() as i64);
                m.stream_length.set(state.stream_length as i64);
            }
            Err(e) => debug!(stream = %self.stream, group = %self.group, "polling the group's state failed: {e}"),
        }
    }

    /// Consumer hygiene: removes the group's consumers that have been idle past
    /// the limit and hold nothing (`forget_consumers.lua`), so XINFO stays
    /// readable as pods come and go; never one with pending entries.
    async fn forget_dead_consumers(&mut self) {
        let Some(limit) = self.shared.consumer_idle_limit else { return };
        if self.no_ack || self.group_lost || self.paused() {
            return;
        }
        let mut conn = self.shared.redis.conn.clone();
        let removed: Result<Vec<String>, RedisError> = self
            .shared
            .redis
            .scripts
            .forget_consumers
            .key(&self.stream)
            .arg(&self.group)
            .arg(&self.shared.consumer)
            .arg(limit.as_millis() as u64)
            .invoke_async(&mut conn)
            .await;
        match removed {
            Ok(removed) if !removed.is_empty() => {
                info!(stream = %self.stream, group = %self.group, ?removed, "removed idle consumers that held nothing")
            }
            Ok(_) => {}
            Err(e) => self.redis_failed("removing idle consumers", &e),
        }
    }

    /// The reclaim beat: takes over entries idle longer than the minimum in any
    /// consumer's PEL (XAUTOCLAIM … JUSTID, which does not count a delivery),
    /// no more than there is credit for, following XAUTOCLAIM's cursor.
    async fn reclaim(&mut self) {
        if self.no_ack || self.draining || self.group_lost || self.paused() {
            return;
        }
        for _ in 0..RECLAIM_PAGES_PER_BEAT {
            // Credit not yet spoken for by entries on hand. The blocking read
            // usually holds all free credit, so it is left out here: entries
            // taken now are handed out as soon as that read returns (BLOCK
            // bounds the wait), and memory stays bounded by twice the credit.
            let slots: usize = self.sessions.values().map(Session::free).sum();
            let count = slots.saturating_sub(self.ready.len() + self.waiting.len()).min(BATCH_MAX);
            if count == 0 {
                return;
            }
            let mut conn = self.shared.redis.conn.clone();
            let reply: Result<Value, RedisError> = redis::cmd("XAUTOCLAIM")
                .arg(&self.stream)
                .arg(&self.group)
                .arg(&self.shared.consumer)
                .arg(self.shared.reclaim_min_idle.as_millis() as u64)
                .arg(self.reclaim_cursor.to_string())
                .arg("COUNT")
                .arg(count)
                .arg("JUSTID")
                .query_async(&mut conn)
                .await;
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => return self.redis_failed("reclaiming idle entries", &e),
            };
            let parts = array(&reply);
            let Some(Ok(next)) = parts.first().map(parse_stream_id) else { return };
            let now = Instant::now();
            let mut taken = 0;
            for id in parts.get(1).map(array).unwrap_or_default().iter().filter_map(|v| parse_stream_id(v).ok()) {
                if !self.entries.contains_key(&id) {
                    self.wait(id, now);
                    taken += 1;
                }
            }
            for id in parts.get(2).map(array).unwrap_or_default().iter().filter_map(|v| parse_stream_id(v).ok()) {
                self.trimmed_while_pending(id);
            }
            if taken > 0 {
                info!(stream = %self.stream, group = %self.group, taken, "reclaimed idle entries");
                self.metrics.reclaimed.inc_by(taken);
            }
            self.reclaim_cursor = next;
            if next == StreamId::ZERO {
                return;
            }
        }
    }
}

/// The reader task and its channels.
struct Reader {
    requests: mpsc::Sender<usize>,
    results: mpsc::Receiver<Result<Value, RedisError>>,
    task: JoinHandle<()>,
}

impl Reader {
    fn spawn(shared: Arc<Shared>, stream: String, group: String, no_ack: bool) -> Reader {
        let (requests, requests_rx) = mpsc::channel(1);
        let (results_tx, results) = mpsc::channel(1);
        let task = tokio::spawn(read_loop(shared, stream, group, no_ack, requests_rx, results_tx));
        Reader { requests, results, task }
    }
}

/// The next reply of the reader; never resolves while there is none.
async fn next_read(reader: &mut Option<Reader>) -> Result<Value, RedisError> {
    if let Some(reader) = reader {
        if let Some(result) = reader.results.recv().await {
            return result;
        }
    }
    std::future::pending().await
}

/// The reader: XREADGROUP `>` with BLOCK on a connection of its own, one request
/// at a time, for as many entries as the worker has credit for.
async fn read_loop(
    shared: Arc<Shared>,
    stream: String,
    group: String,
    no_ack: bool,
    mut requests: mpsc::Receiver<usize>,
    results: mpsc::Sender<Result<Value, RedisError>>,
) {
    let mut conn = None;
    while let Some(count) = requests.recv().await {
        let result = async {
            if conn.is_none() {
                conn = Some(shared.redis.dedicated(shared.redis_timeout).await?);
            }
            let c = conn.as_mut().expect("connected above");
            redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(&group)
                .arg(&shared.consumer)
                .arg("COUNT")
                .arg(count)
                .arg("BLOCK")
                .arg(shared.read_block.as_millis() as u64)
                .arg(no_ack.then_some("NOACK"))
                .arg("STREAMS")
                .arg(&stream)
                .arg(">")
                .query_async::<Value>(c)
                .await
        }
        .await;
        if let Err(e) = &result {
            if crate::error::is_transient(e) {
                conn = None;
            }
        }
        if results.send(result).await.is_err() {
            return;
        }
    }
}

/// NOGROUP, or UNBLOCKED: Redis 7.0 wakes a reader blocked on a stream that was
/// deleted with UNBLOCKED (7.2 says NOGROUP). Not the UNBLOCKED of a primary
/// turning replica in a failover ("instance state changed"): the group is
/// fine, the read is retried on the new primary.
fn is_group_lost(error: &RedisError) -> bool {
    let text = error.to_string();
    if text.contains("instance state changed") {
        return false;
    }
    matches!(error.code(), Some("NOGROUP" | "UNBLOCKED")) || text.contains("NOGROUP") || text.contains("UNBLOCKED")
}
