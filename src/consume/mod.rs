//! The Consume call: validate the subscribe, open the group door, attach the
//! call to its group's worker, then relay frames both ways.
//!
//! A delivery reads forward: Redis reply → `worker` (into the `ledger`) →
//! `session` → gRPC frame; a verdict back: gRPC frame → `session` →
//! `worker` → `ledger` → XACK (`settle`). The files, one per job, are
//! listed in the crate's Layout section. What follows is the behaviour they
//! implement, the same text as the docs site's "How Consume behaves" page
//! (`src/consume/README.md`).
//!
#![doc = include_str!("README.md")]

mod ack_emit;
mod commands;
mod dead_letter;
mod delivery;
mod emits;
mod gauges;
mod hygiene;
mod key_waits;
pub(crate) mod keyed;
mod lease;
mod ledger;
mod orders;
mod outlet;
mod pacing;
mod reader;
mod reclaim_probe;
mod recovery;
mod release;
mod retry;
#[cfg(test)]
mod script_replies;
mod session;
mod settle;
pub(crate) mod subscribe;
mod verdicts;
mod window;
mod worker;

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use tokio::{
    sync::{mpsc, oneshot, watch, Semaphore},
    task::JoinSet,
};
use tokio_stream::{wrappers::ReceiverStream, Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::{
    config::{Config, SharedReaders, SHARED_MOST_SIDECARS},
    durable::DurableWriter,
    error::Error,
    metrics::Metrics,
    proto::{consume_request::Kind, consumer_service_server::ConsumerService, ConsumeRequest, ConsumeResponse},
    redis::{readers::ReaderPool, wake::WakeHub, Redis},
    security::{Caller, Guard},
    wire::Origin,
};
use commands::{Command, Event};
use ledger::Policy;
use orders::{Backoff, SessionId};
use reader::{ReaderPools, SharedReads};
use subscribe::Subscription;
use worker::Worker;

/// How long a new Consume call may take to send its subscribe.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(30);
/// Frames buffered toward one client before the sidecar waits for it to read.
const OUTBOUND_BUFFER: usize = 64;

/// The sidecar's state changes the consume path follows.
pub struct Signals {
    /// Turns true on shutdown: hand out nothing new, keep taking verdicts.
    pub draining: watch::Receiver<bool>,
    /// Turns true when calls are to end.
    pub closing: watch::Receiver<bool>,
    /// Whether the readiness check (PING, ROLE every second) finds Redis usable.
    pub redis_up: watch::Receiver<bool>,
}

/// What every worker and call of this sidecar share.
pub(crate) struct Shared {
    pub(crate) redis: Redis,
    pub(crate) consumer: String,
    pub(crate) id_field: String,
    pub(crate) read_block: Duration,
    /// The group readers' connections: a blocking reader takes one for its
    /// group's first call (or when its group turns to blocking) and gives it
    /// back when its last call leaves; a shared reader takes one per read.
    pub(crate) readers: ReaderPools,
    pub(crate) reclaim_min_idle: Duration,
    pub(crate) reclaim_interval: Duration,
    /// The reclaim beat is batched across groups ([`reclaim_probe`]); else each worker beats.
    pub(crate) batched_reclaim: bool,
    pub(crate) lease_refresh: Duration,
    /// `--key-wait-poll-ms`: how often entries waiting for their key are
    /// put through the gate again.
    pub(crate) key_wait_poll: Duration,
    /// The largest frame a client accepts (bytes): larger entries are dead-lettered.
    pub(crate) max_message_bytes: usize,
    /// The durable writer (`--wait-replicas`, `--wait-aof`), which confirms
    /// AckEmits as it confirms appends; `None`: they run on the shared connection.
    pub(crate) durable: Option<DurableWriter>,
    /// Other consumers idle this long and holding nothing are removed; `None`: never.
    pub(crate) consumer_idle_limit: Option<Duration>,
    /// Becomes true on shutdown: hand out nothing new, keep taking verdicts.
    pub(crate) draining: watch::Receiver<bool>,
    /// Whether the readiness check finds Redis usable: when it turns true
    /// again, workers end the backoff their failed steps ran up meanwhile.
    pub(crate) redis_up: watch::Receiver<bool>,
    /// Deliveries held by calls across all workers (entries): what shutdown waits for.
    pub(crate) held: AtomicUsize,
    /// Deliveries that calls ended holding since shutdown began.
    pub(crate) returned_while_draining: AtomicUsize,
    pub(crate) metrics: Arc<Metrics>,
    /// How often each group's state is polled into gauges; `None`: never.
    pub(crate) metrics_poll: Option<Duration>,
    /// Which of the workers' failed steps are logged at WARN.
    pub(crate) failure_log: pacing::LogLimit,
    /// Which re-created groups are logged at INFO: a Redis that restarted
    /// empty loses every group at once.
    pub(crate) recreation_log: pacing::LogLimit,
    /// Which batches of acks found partly not pending are logged at WARN.
    pub(crate) shortfall_log: pacing::LogLimit,
    /// Which Consume calls refused at `--max-consume-calls` are logged at
    /// WARN: a fleet that outgrew the setting retries them all at once.
    pub(crate) refusal_log: pacing::LogLimit,
    /// Which calls stalled at their window's cap are logged at WARN: a
    /// fleet of collecting clients whose batch is over the cap stalls at once.
    pub(crate) window_cap_log: pacing::LogLimit,
}

impl Shared {
    /// Every sidecar-wide log limit, for the held-back counts of a burst
    /// once it is over ([`pacing::LogLimit::log_overdue`]).
    pub(crate) fn log_limits(&self) -> [&pacing::LogLimit; 5] {
        [&self.failure_log, &self.recreation_log, &self.shortfall_log, &self.refusal_log, &self.window_cap_log]
    }
}

/// One group's names, as every Redis step of its worker needs them.
pub(crate) struct GroupKeys {
    pub(crate) redis: Redis,
    pub(crate) stream: String,
    pub(crate) group: String,
    /// This sidecar's consumer name in the group.
    pub(crate) consumer: String,
    /// `<stream>:retries:<group>`, the group's retry hash (see [`retry`]).
    pub(crate) retries: String,
    /// `<stream>:keys:<group>`, the group's keyed entries (see [`keyed`]).
    pub(crate) keyed: String,
    /// Every key of this group alone ([`crate::keys::Keyspace::group_keys`]):
    /// its heartbeat hash (see [`hygiene`]) first, then its retry hash and
    /// its keyed entries.
    pub(crate) own_keys: [String; 3],
    /// The reserved branded-id field.
    pub(crate) id_field: String,
    /// `stream` and `group` again, as every delivery of the group names them.
    pub(crate) origin: Arc<Origin>,
}

impl GroupKeys {
    fn new(shared: &Shared, stream: String, group: String) -> GroupKeys {
        GroupKeys {
            redis: shared.redis.clone(),
            retries: shared.redis.keys.retries(&stream, &group),
            keyed: shared.redis.keys.keys(&stream, &group),
            own_keys: shared.redis.keys.group_keys(&stream, &group),
            consumer: shared.consumer.clone(),
            id_field: shared.id_field.clone(),
            origin: Arc::new(Origin { stream: stream.clone(), group: group.clone() }),
            stream,
            group,
        }
    }
}

/// The consumer side of the sidecar: the gRPC service and the group workers
/// behind it. Cheap to clone.
#[derive(Clone)]
pub struct Consumers {
    shared: Arc<Shared>,
    defaults: Arc<Defaults>,
    workers: Arc<Mutex<WorkerMap>>,
    tasks: Arc<Mutex<JoinSet<()>>>,
    next_session: Arc<AtomicU64>,
    /// Becomes true when calls must end (after the shutdown grace period).
    closing: watch::Receiver<bool>,
    guard: Guard,
    /// One permit per open Consume call (`--max-consume-calls`).
    calls: Arc<Semaphore>,
    max_calls: usize,
}

/// The wake hub for shared readers, as `--shared-readers` asks
/// ([`SharedReaders`]): `off`, or `auto` on a cluster, `None` (blocking
/// readers); on a single server, a [`WakeHub`] connected now. `auto` falls
/// back to blocking readers, with one warning naming the reason and the
/// flag, when the server refuses RESP3 or `CLIENT TRACKING`; a hub that
/// cannot connect for another reason (Redis unreachable a moment) is kept,
/// and connects on the first read.
///
/// Errors (`on` only): the reason shared readers cannot be had here, for a
/// refusal to start.
pub async fn wake_hub(redis: &Redis, config: &Config) -> Result<Option<Arc<WakeHub>>, String> {
    let mode = config.redis.shared_readers;
    if mode == SharedReaders::Off {
        return Ok(None);
    }
    let Some(primary) = redis.primary() else {
        if mode == SharedReaders::On {
            return Err(
                "--shared-readers on (ECHOMQ_SHARED_READERS): shared readers need a single Redis server \
                        (or Sentinel); on a Redis Cluster the readers block, one connection per group: use auto or off"
                    .to_owned(),
            );
        }
        tracing::info!("readers block on XREADGROUP, one connection per group: shared readers are for a single server, not a cluster (--shared-readers)");
        return Ok(None);
    };
    match WakeHub::start(primary.clone(), config.redis.redis_timeout).await {
        Ok(hub) => {
            let which = if mode == SharedReaders::On {
                "every group's reads are shared".to_owned()
            } else {
                format!("a group's reads are shared while at most {SHARED_MOST_SIDECARS} sidecars read it, and block beyond")
            };
            tracing::info!("{which}: a wake connection tracks the streams read (CLIENT TRACKING), and shared reads take turns on at most {} connections (--shared-reader-connections)", config.redis.shared_reader_connections);
            Ok(Some(hub))
        }
        Err(e) if mode == SharedReaders::On => Err(format!(
            "--shared-readers on (ECHOMQ_SHARED_READERS): the wake connection (RESP3, CLIENT TRACKING ON) could not be made: {e}"
        )),
        Err(e) if crate::redis::wake::refuses_tracking(&e) => {
            tracing::warn!("readers block on XREADGROUP, one connection per group, instead of sharing: the server refused what shared readers need (HELLO 3 for RESP3, or CLIENT TRACKING ON; an old server, a proxy, or an ACL without +client|tracking): {e}; set --shared-readers off (ECHOMQ_SHARED_READERS) to say so and silence this");
            Ok(None)
        }
        Err(e) => {
            tracing::warn!("the wake connection of shared readers could not be made now ({e}); readers poll every --read-block-ms until it is");
            Ok(Some(WakeHub::unconnected(primary.clone(), config.redis.redis_timeout)))
        }
    }
}

/// Renews the wake connection each time the readiness check finds Redis
/// usable again after it was not ([`WakeHub::renew`]): whatever the outage
/// did to that connection, the shared readers read once and wait on a fresh
/// one. Ends with the hub.
async fn renew_wake_after_outages(hub: std::sync::Weak<WakeHub>, mut redis_up: watch::Receiver<bool>) {
    let mut was_up = *redis_up.borrow_and_update();
    while redis_up.changed().await.is_ok() {
        let up = *redis_up.borrow_and_update();
        if up && !was_up {
            let Some(hub) = hub.upgrade() else { return };
            hub.renew("Redis answers the readiness check again after it did not");
        }
        was_up = up;
    }
}

/// The worker of each (stream, group) this sidecar serves.
pub(crate) type WorkerMap = HashMap<(String, String, bool), mpsc::WeakSender<Command>>;

/// The hot path's maps keyed by entry (held deliveries, routes, tracked
/// entries): several lookups per delivery, where std's SipHash showed in
/// profiles. foldhash (already in the tree, through hashbrown) with a
/// per-map random seed is several times faster on these 16-byte keys.
pub(crate) type IdMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

struct Defaults {
    max_deliveries: u32,
    max_in_flight: u32,
    max_in_flight_limit: u32,
    backoff: Backoff,
}

impl Consumers {
    /// Builds the consumer side. `draining` turns true when the sidecar stops
    /// handing out entries; `closing` when calls must end. `durable`: the
    /// writer that confirms AckEmits with replicas, when writes wait.
    /// `wake`: the wake hub of shared readers ([`wake_hub`]); `None`:
    /// blocking readers.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        redis: Redis,
        metrics: Arc<Metrics>,
        config: &Config,
        consumer: String,
        signals: Signals,
        guard: Guard,
        durable: Option<DurableWriter>,
        wake: Option<Arc<WakeHub>>,
    ) -> Consumers {
        let Signals { draining, closing, redis_up } = signals;
        let redis_timeout = config.redis.redis_timeout;
        let pool = |max, shared| {
            ReaderPool::new(redis.clone(), max, redis_timeout, config.consume.read_block, shared, &metrics)
        };
        // `on` never blocks; without a hub (`off`, a cluster, a server that refused tracking) nothing shares.
        let readers = ReaderPools {
            blocking: (wake.is_none() || config.redis.shared_readers != SharedReaders::On)
                .then(|| pool(config.redis.reader_connections, false)),
            shared: wake.map(|hub| SharedReads { hub, pool: pool(config.redis.shared_reader_connections, true) }),
        };
        if let Some(shared) = &readers.shared {
            tokio::spawn(renew_wake_after_outages(Arc::downgrade(&shared.hub), redis_up.clone()));
        }
        let batched_reclaim = reclaim_probe::batched(&redis);
        let log_limit =
            |level, what, counted_by| pacing::LogLimit::new(tokio::time::Instant::now(), level, what, counted_by);
        let shared = Shared {
            readers,
            redis,
            consumer,
            id_field: config.appends.id_field.clone(),
            read_block: config.consume.read_block,
            reclaim_min_idle: config.consume.reclaim_min_idle,
            reclaim_interval: config.consume.reclaim_interval,
            batched_reclaim,
            lease_refresh: config.consume.lease_refresh_interval(),
            key_wait_poll: config.consume.key_wait_poll,
            max_message_bytes: config.server.max_message_bytes,
            durable,
            consumer_idle_limit: config.consume.consumer_removal(),
            draining,
            redis_up,
            held: AtomicUsize::new(0),
            returned_while_draining: AtomicUsize::new(0),
            metrics,
            metrics_poll: config.admin.metrics_poll(),
            failure_log: log_limit(
                pacing::LineLevel::Warn,
                "failed steps or lost groups of group workers",
                "echomq_redis_errors_total counts each failed step",
            ),
            recreation_log: log_limit(
                pacing::LineLevel::Info,
                "groups re-created or found again",
                "echomq_group_recreations_total counts each",
            ),
            shortfall_log: log_limit(
                pacing::LineLevel::Warn,
                "batches of acks partly no longer pending",
                "echomq_acks_not_pending_total counts each ack",
            ),
            refusal_log: log_limit(
                pacing::LineLevel::Warn,
                "Consume calls refused at --max-consume-calls",
                "grpc_server_handled_total counts each, code RESOURCE_EXHAUSTED",
            ),
            window_cap_log: log_limit(
                pacing::LineLevel::Warn,
                "calls stalled at their window's cap",
                "echomq_window_stalls_total counts every stall",
            ),
        };
        let defaults = Defaults {
            max_deliveries: config.consume.default_max_deliveries,
            max_in_flight: config.consume.default_max_in_flight(),
            max_in_flight_limit: config.consume.max_in_flight_limit,
            backoff: Backoff { initial: config.consume.retry_backoff_initial, max: config.consume.retry_backoff_max },
        };
        let shared = Arc::new(shared);
        let workers: Arc<Mutex<WorkerMap>> = Arc::default();
        if shared.batched_reclaim {
            let every = shared.reclaim_interval;
            tokio::spawn(reclaim_probe::run(Arc::downgrade(&shared), Arc::downgrade(&workers), every));
        }
        Consumers {
            shared,
            defaults: Arc::new(defaults),
            workers,
            tasks: Arc::default(),
            next_session: Arc::default(),
            closing,
            guard,
            calls: Arc::new(Semaphore::new(config.consume.max_consume_calls)),
            max_calls: config.consume.max_consume_calls,
        }
    }

    /// Deliveries currently held by calls, across all groups (entries).
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::Relaxed)
    }

    /// Deliveries that calls ended holding, without a verdict, since shutdown
    /// began (entries): they stay pending.
    pub fn returned_while_draining(&self) -> usize {
        self.shared.returned_while_draining.load(Ordering::Relaxed)
    }

    /// Stops every group worker once its calls are gone and waits up to
    /// `timeout` for them to flush their last acks.
    pub async fn shutdown(&self, timeout: Duration) {
        self.workers.lock().expect("workers lock").clear();
        let mut tasks = std::mem::take(&mut *self.tasks.lock().expect("tasks lock"));
        let joined = tokio::time::timeout(timeout, async { while tasks.join_next().await.is_some() {} }).await;
        if joined.is_err() {
            tracing::warn!(
                "group workers did not stop within {timeout:?}; aborting them (un-acked entries stay pending)"
            );
            tasks.abort_all();
        }
    }

    /// The worker of `stream` and `group` (and mode), started on first use,
    /// and again once the last one retired. One per pair: two workers under
    /// one consumer name would hand one entry to two calls. The map holds a
    /// weak sender: a worker whose channel has closed is past serving (it
    /// only finishes its last flush), and the new one takes its place.
    fn worker(&self, stream: &str, group: &str, no_ack: bool) -> mpsc::Sender<Command> {
        let mut workers = self.workers.lock().expect("workers lock");
        let key = (stream.to_owned(), group.to_owned(), no_ack);
        if let Some(worker) = workers.get(&key).and_then(mpsc::WeakSender::upgrade) {
            return worker;
        }
        let (sender, task) = Worker::spawn(self.shared.clone(), key.0.clone(), key.1.clone(), no_ack);
        let (map, shared) = (Arc::downgrade(&self.workers), Arc::downgrade(&self.shared));
        let retired = key.clone();
        self.tasks.lock().expect("tasks lock").spawn(async move {
            let _ = task.await;
            if let (Some(map), Some(shared)) = (map.upgrade(), shared.upgrade()) {
                forget_retired(&map, &shared, retired);
            }
        });
        workers.insert(key, sender.downgrade());
        sender
    }

    /// Attaches call `session` to the worker of each of its shards, each with
    /// an even share of the call's credit (so a busy shard cannot starve the
    /// others), all sending to `events`. On a refusal the shards already
    /// attached are detached again: the call never starts.
    async fn attach(
        &self,
        sub: &Subscription,
        session: SessionId,
        policy: &Policy,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<Vec<mpsc::Sender<Command>>, Error> {
        let mut workers: Vec<mpsc::Sender<Command>> = Vec::with_capacity(sub.shards.len());
        let shard_count = sub.shards.len() as u32;
        for (shard, (stream, group_policy)) in sub.shards.iter().enumerate() {
            let share = ledger::shard_share(policy.max_in_flight, shard_count, shard as u32);
            let worker = self.worker(stream, &sub.group, sub.no_ack);
            let (reply, attached) = oneshot::channel();
            let attach = Command::Attach(Box::new(commands::Attach {
                session,
                shard,
                policy: Policy { max_in_flight: share, ..policy.clone() },
                group: group_policy.clone(),
                events: events.clone(),
                reply,
            }));
            let result = match worker.send(attach).await {
                Ok(()) => attached.await.unwrap_or(Err(Error::ShuttingDown)),
                Err(_) => Err(Error::ShuttingDown),
            };
            if let Err(e) = result {
                for earlier in &workers {
                    let (flushed, _) = oneshot::channel();
                    let _ = earlier.send(Command::Detach { session, flushed }).await;
                }
                return Err(e);
            }
            workers.push(worker);
        }
        Ok(workers)
    }
}

type ConsumeStream = Pin<Box<dyn Stream<Item = Result<ConsumeResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ConsumerService for Consumers {
    type ConsumeStream = ConsumeStream;

    async fn consume(&self, request: Request<Streaming<ConsumeRequest>>) -> Result<Response<ConsumeStream>, Status> {
        if *self.shared.draining.borrow() {
            return Err(Error::ShuttingDown.into());
        }
        let caller = request.extensions().get::<Caller>().cloned();
        let mut inbound = request.into_inner();
        // A call that never subscribes must not hold a slot for ever.
        let first = tokio::time::timeout(SUBSCRIBE_TIMEOUT, inbound.message()).await.map_err(|_| {
            Error::invalid("subscribe", format!("no subscribe within {SUBSCRIBE_TIMEOUT:?} of opening the call"))
        })?;
        let subscribe = match first.map_err(crate::error::inbound_status)? {
            Some(ConsumeRequest { kind: Some(Kind::Subscribe(subscribe)) }) => subscribe,
            Some(_) => {
                return Err(
                    Error::invalid("subscribe", "the first message of a Consume call must be a subscribe").into()
                )
            }
            None => return Err(Error::invalid("subscribe", "the call closed before its subscribe").into()),
        };
        let (sub, policy) = self.validate(caller.as_ref(), subscribe)?;
        // Blocking readers only: one per shard, so a subscription that needs
        // more than the pool holds can never be served, and is refused at
        // once, not after a wait. Shared readers take turns: any count will do.
        if let (Some(pool), None) = (&self.shared.readers.blocking, &self.shared.readers.shared) {
            let max_readers = pool.max();
            if sub.shards.len() > max_readers {
                return Err(Error::ResourceExhausted {
                    reason: format!(
                        "subscribing to `{}` needs {} reader connections (one per shard), more than this sidecar's \
                     --reader-connections / ECHOMQ_READER_CONNECTIONS ({max_readers}); raise the setting",
                        sub.stream,
                        sub.shards.len()
                    ),
                }
                .into());
            }
        }
        // Held for the life of the call.
        let permit = self.calls.clone().try_acquire_owned().map_err(|_| {
            let reason =
                format!("this sidecar already serves its limit of {} Consume calls (--max-consume-calls)", self.max_calls);
            let (stream, group) = (&sub.stream, &sub.group);
            pacing::log_limited!(self.shared.refusal_log, &format!("a Consume call was refused: {reason}"); %stream, %group);
            Error::ResourceExhausted { reason }
        })?;
        self.open_groups(&sub).await?;

        let session = self.next_session.fetch_add(1, Ordering::Relaxed);
        let max_in_flight = policy.max_in_flight;
        let (events_tx, events) = mpsc::unbounded_channel();
        let workers = self.attach(&sub, session, &policy, events_tx).await?;

        let (outbound, outbound_rx) = mpsc::channel(OUTBOUND_BUFFER);
        let subscribed = crate::proto::Subscribed {
            stream: sub.stream.clone(),
            group: sub.group.clone(),
            consumer: self.shared.consumer.clone(),
            max_in_flight,
        };
        let _ = outbound.try_send(Ok(session::response(crate::proto::consume_response::Kind::Subscribed(subscribed))));
        tracing::info!(stream = %sub.stream, group = %sub.group, session, max_in_flight, "call subscribed");
        let closing = self.closing.clone();
        let framing = session::Framing { max_batch: sub.max_batch, max_bytes: self.shared.max_message_bytes };
        let first_shard = &sub.shards[0].0;
        let verdict_errors = self.shared.metrics.verdict_errors(
            first_shard,
            self.shared.redis.keys.sharded_stream_of(first_shard),
            &sub.group,
        );
        let streams: Vec<String> = sub.shards.iter().map(|(stream, _)| stream.clone()).collect();
        let emit_rules = emits::EmitRules {
            guard: self.guard.clone(),
            caller,
            keys: self.shared.redis.keys.clone(),
            id_field: self.shared.id_field.clone(),
            max_message_bytes: self.shared.max_message_bytes,
        };
        // Should the relay ever panic, its call's entries must not stay
        // held: the worker is told the call ended, as on any other end.
        let detach = workers.clone();
        let shards = session::Shards::new(workers, streams);
        let relay = tokio::spawn(session::relay(Box::new(session::Relay {
            session,
            inbound,
            events,
            outbound,
            shards,
            framing,
            closing,
            verdict_errors,
            emit_rules,
            max_ids: self.defaults.max_in_flight_limit as usize,
        })));
        // Spawned after the relay, so that this task, which lives as long
        // as the call, does not hold room for the relay's arguments.
        tokio::spawn(async move {
            if let Err(e) = relay.await {
                tracing::error!(session, "a call's relay failed: {e}; its entries go back to the PEL");
                for worker in detach {
                    let (flushed, _) = oneshot::channel();
                    let _ = worker.send(Command::Detach { session, flushed }).await;
                }
            }
            drop(permit);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(outbound_rx).map(|frame| frame.map(|response| *response)))))
    }
}

/// A worker ended: its entry leaves the map (unless a new worker has taken
/// its place), and, when no worker of the group is left here (a NOACK one
/// shares its series), so do the group's series. Under the map's lock, as
/// a new worker makes its series there: none is removed from under it.
fn forget_retired(map: &Mutex<WorkerMap>, shared: &Shared, key: (String, String, bool)) {
    let mut workers = map.lock().expect("workers lock");
    if workers.get(&key).is_some_and(|worker| worker.strong_count() == 0) {
        workers.remove(&key);
    }
    let (stream, group, _) = key;
    let (mut group_served, mut stream_served) = (false, false);
    for ((other_stream, other_group, _), worker) in workers.iter() {
        if *other_stream == stream && worker.strong_count() > 0 {
            stream_served = true;
            group_served |= *other_group == group;
        }
    }
    if !group_served {
        let operations = pacing::Step::ALL.map(pacing::Step::label);
        let sharded_stream = shared.redis.keys.sharded_stream_of(&stream);
        shared.metrics.forget_group(&stream, sharded_stream, &group, &operations, stream_served);
    }
}
