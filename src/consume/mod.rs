//! The Consume call: validate the subscribe, open the group door, attach the
//! call to its group's worker, then relay frames both ways.
//!
//! A delivery reads forward: Redis reply → `worker` → `session` → gRPC
//! frame; a verdict back: gRPC frame → `session` → `worker` → XACK.

mod dead_letter;
mod delivery;
mod gauges;
mod hygiene;
mod lease;
mod ledger;
mod reader;
mod recovery;
mod retry;
mod session;
mod settle;
mod verdicts;
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
use tokio_stream::{wrappers::ReceiverStream, Stream};
use tonic::{Request, Response, Status, Streaming};

use crate::{
    config::Config,
    error::Error,
    id::StreamId,
    metrics::Metrics,
    proto::{
        consume_request::Kind, consumer_service_server::ConsumerService, ConsumeRequest, ConsumeResponse, GroupStart,
        Subscribe,
    },
    redis::Redis,
    security::{Caller, Guard},
};
use dead_letter::GroupPolicy;
use ledger::{Event, Policy, SessionId};
use retry::Backoff;
use worker::{Command, Worker};

/// How long a new Consume call may take to send its subscribe.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(30);
/// Frames buffered toward one client before the sidecar waits for it to read.
const OUTBOUND_BUFFER: usize = 64;

/// What every worker and call of this sidecar share.
pub(crate) struct Shared {
    pub(crate) redis: Redis,
    pub(crate) consumer: String,
    pub(crate) id_field: String,
    pub(crate) read_block: Duration,
    pub(crate) redis_timeout: Duration,
    pub(crate) reclaim_min_idle: Duration,
    pub(crate) reclaim_interval: Duration,
    pub(crate) lease_refresh: Duration,
    /// The largest frame a client accepts (bytes): larger entries are dead-lettered.
    pub(crate) max_message_bytes: usize,
    /// Other consumers idle this long and holding nothing are removed; `None`: never.
    pub(crate) consumer_idle_limit: Option<Duration>,
    /// Becomes true on shutdown: hand out nothing new, keep taking verdicts.
    pub(crate) draining: watch::Receiver<bool>,
    /// Deliveries held by calls across all workers (entries): what shutdown waits for.
    pub(crate) held: AtomicUsize,
    /// Deliveries that calls ended holding since shutdown began.
    pub(crate) returned_while_draining: AtomicUsize,
    pub(crate) metrics: Arc<Metrics>,
    /// How often each group's state is polled into gauges; `None`: never.
    pub(crate) metrics_poll: Option<Duration>,
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
    /// The reserved branded-id field.
    pub(crate) id_field: String,
}

impl GroupKeys {
    fn new(shared: &Shared, stream: String, group: String) -> GroupKeys {
        GroupKeys {
            redis: shared.redis.clone(),
            retries: shared.redis.keys.retries(&stream, &group),
            consumer: shared.consumer.clone(),
            id_field: shared.id_field.clone(),
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

/// The worker of each (stream, group) this sidecar serves.
type WorkerMap = HashMap<(String, String, bool), mpsc::Sender<Command>>;

struct Defaults {
    max_deliveries: u32,
    max_in_flight: u32,
    max_in_flight_limit: u32,
    backoff: Backoff,
}

impl Consumers {
    /// Builds the consumer side. `draining` turns true when the sidecar stops
    /// handing out entries; `closing` when calls must end.
    pub fn new(
        redis: Redis,
        metrics: Arc<Metrics>,
        config: &Config,
        consumer: String,
        draining: watch::Receiver<bool>,
        closing: watch::Receiver<bool>,
        guard: Guard,
    ) -> Consumers {
        let shared = Shared {
            redis,
            consumer,
            id_field: config.id_field.clone(),
            read_block: Duration::from_millis(config.read_block_ms),
            redis_timeout: Duration::from_millis(config.redis_timeout_ms),
            reclaim_min_idle: config.reclaim_min_idle(),
            reclaim_interval: Duration::from_millis(config.reclaim_interval_ms),
            lease_refresh: config.lease_refresh_interval(),
            max_message_bytes: config.max_message_bytes,
            consumer_idle_limit: (config.consumer_idle_limit_ms > 0)
                .then(|| Duration::from_millis(config.consumer_idle_limit_ms)),
            draining,
            held: AtomicUsize::new(0),
            returned_while_draining: AtomicUsize::new(0),
            metrics,
            metrics_poll: (config.metrics_poll_interval_ms > 0)
                .then(|| Duration::from_millis(config.metrics_poll_interval_ms)),
        };
        let defaults = Defaults {
            max_deliveries: config.default_max_deliveries,
            max_in_flight: config.default_max_in_flight,
            max_in_flight_limit: config.max_in_flight_limit,
            backoff: Backoff {
                initial: Duration::from_millis(config.retry_backoff_initial_ms),
                max: Duration::from_millis(config.retry_backoff_max_ms),
            },
        };
        Consumers {
            shared: Arc::new(shared),
            defaults: Arc::new(defaults),
            workers: Arc::default(),
            tasks: Arc::default(),
            next_session: Arc::default(),
            closing,
            guard,
            calls: Arc::new(Semaphore::new(config.max_consume_calls)),
            max_calls: config.max_consume_calls,
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

    /// The worker of `stream` and `group` (and mode), started on first use. One
    /// per pair: two workers under one consumer name would hand one entry to
    /// two calls.
    fn worker(&self, stream: &str, group: &str, no_ack: bool) -> mpsc::Sender<Command> {
        let mut workers = self.workers.lock().expect("workers lock");
        let key = (stream.to_owned(), group.to_owned(), no_ack);
        if let Some(worker) = workers.get(&key) {
            return worker.clone();
        }
        let (sender, task) = Worker::spawn(self.shared.clone(), key.0.clone(), key.1.clone(), no_ack);
        self.tasks.lock().expect("tasks lock").spawn(async move {
            let _ = task.await;
        });
        workers.insert(key, sender.clone());
        sender
    }

    fn validate(&self, caller: Option<&Caller>, subscribe: Subscribe) -> Result<(Subscription, Policy), Error> {
        let stream = self.guard.stream(caller, "subscribe.stream", &subscribe.stream)?.to_owned();
        let keys = &self.shared.redis.keys;
        let shards = keys.shards(&stream).unwrap_or_else(|| vec![stream.clone()]);
        let group = self.guard.name("subscribe.group", &subscribe.group)?.to_owned();
        let start = match GroupStart::try_from(subscribe.group_start) {
            Ok(GroupStart::New) => "$".to_owned(),
            Ok(GroupStart::Beginning) => "0".to_owned(),
            Ok(GroupStart::Id) => subscribe
                .start_id
                .parse::<StreamId>()
                .map_err(|e| Error::invalid("subscribe.start_id", format!("required with GROUP_START_ID: {e}")))?
                .to_string(),
            Ok(GroupStart::Instant) => {
                let at = subscribe.start_time.ok_or_else(|| {
                    Error::invalid("subscribe.start_time", "required with GROUP_START_INSTANT")
                })?;
                let ms = crate::entry::unix_ms_of("subscribe.start_time", at)?;
                let latest = crate::entry::now_unix_ms() + START_TIME_SKEW.as_millis() as u64;
                if ms > latest {
                    return Err(Error::invalid(
                        "subscribe.start_time",
                        format!(
                            "{} ms in the future: a new group would skip every entry appended until then \
                             (a unit mix-up?); give an instant in the past (at most {} s ahead, for clock skew)",
                            ms - crate::entry::now_unix_ms(),
                            START_TIME_SKEW.as_secs()
                        ),
                    ));
                }
                // The group's last-delivered id is exclusive: the last id before `ms`.
                StreamId { ms, seq: 0 }.predecessor().map_or_else(|| "0".to_owned(), |id| id.to_string())
            }
            Ok(GroupStart::Unspecified) | Err(_) => {
                return Err(Error::invalid(
                    "subscribe.group_start",
                    "required: GROUP_START_NEW (only new entries), GROUP_START_BEGINNING (everything the stream holds), GROUP_START_ID or GROUP_START_INSTANT",
                ))
            }
        };
        let max_in_flight = match subscribe.max_in_flight {
            0 => self.defaults.max_in_flight,
            n if n > self.defaults.max_in_flight_limit => {
                return Err(Error::invalid(
                    "subscribe.max_in_flight",
                    format!("{n} is above this sidecar's limit of {}", self.defaults.max_in_flight_limit),
                ))
            }
            n => n,
        }
        // Each shard gets a share of the credit, at least one entry.
        .max(shards.len() as u32);
        let ack_deadline = duration("subscribe.ack_deadline", subscribe.ack_deadline)?.filter(|d| !d.is_zero());
        let backoff_initial = duration("subscribe.retry_backoff_initial", subscribe.retry_backoff_initial)?
            .unwrap_or(self.defaults.backoff.initial);
        let backoff_max =
            duration("subscribe.retry_backoff_max", subscribe.retry_backoff_max)?.unwrap_or(self.defaults.backoff.max);
        if backoff_initial > backoff_max {
            return Err(Error::invalid(
                "subscribe.retry_backoff_initial",
                format!("{backoff_initial:?} is above retry_backoff_max ({backoff_max:?})"),
            ));
        }
        let dead_letter_stream = match subscribe.dead_letter_stream {
            name if name.is_empty() => None,
            name => Some(self.guard.stream(caller, "subscribe.dead_letter_stream", &name)?.to_owned()),
        };
        let mut dead_letter_streams = Vec::with_capacity(shards.len());
        for shard in &shards {
            let dead_letters = dead_letter_stream.clone().unwrap_or_else(|| keys.dead_letter_stream(shard));
            if dead_letters == *shard {
                return Err(Error::invalid(
                    "subscribe.dead_letter_stream",
                    "must differ from the stream: dead letters appended to their own stream come back for ever",
                ));
            }
            let field = if dead_letter_stream.is_some() { "subscribe.dead_letter_stream" } else { "subscribe.stream" };
            keys.same_slot(field, shard, &dead_letters)?;
            keys.same_slot("subscribe.stream", shard, &keys.retries(shard, &group))?;
            dead_letter_streams.push(dead_letters);
        }
        let max_deliveries = match subscribe.max_deliveries {
            0 => self.defaults.max_deliveries,
            n => n,
        };
        let backoff = Backoff { initial: backoff_initial, max: backoff_max };
        let policy = Policy { max_in_flight, ack_deadline, backoff };
        let shards = shards
            .into_iter()
            .zip(dead_letter_streams)
            .map(|(key, dead_letter_stream)| (key, GroupPolicy { max_deliveries, dead_letter_stream }))
            .collect();
        Ok((Subscription { stream, shards, group, start, no_ack: subscribe.no_ack }, policy))
    }

    /// The group door, on each shard: `XGROUP CREATE <stream> <group> <start>
    /// MKSTREAM`. Only BUSYGROUP (the group exists; it keeps its position) is
    /// not an error. Then registers this sidecar's consumer (XGROUP
    /// CREATECONSUMER), so it shows in XINFO CONSUMERS before it first
    /// receives anything.
    async fn open_groups(&self, sub: &Subscription) -> Result<(), Error> {
        for (stream, policy) in &sub.shards {
            self.check_types(stream, &policy.dead_letter_stream, &sub.group).await?;
            self.open_group(sub, stream).await?;
        }
        Ok(())
    }

    /// The dead-letter stream and the retry hash, when they exist, must be a
    /// stream and a hash: another type would fail every dead-lettering or
    /// retry write of the group later (WRONGTYPE), so it is refused now with
    /// FAILED_PRECONDITION. So is a plain stream another sidecar recorded as
    /// sharded (this one was not started with it: it would wait on a key no
    /// producer writes).
    async fn check_types(&self, stream: &str, dead_letters: &str, group: &str) -> Result<(), Error> {
        self.shared.redis.refuse_foreign_shard_key("subscribe.stream", stream).await?;
        let keys = &self.shared.redis.keys;
        let retries = keys.retries(stream, group);
        let wanted = [(dead_letters, "stream"), (retries.as_str(), "hash")];
        if let Some(count) = self.shared.redis.recorded_shard_count(stream).await? {
            return Err(keys.unconfigured_sharded(stream, &count.to_string()));
        }
        // One round trip; on a cluster both keys share the stream's slot (checked in validation).
        let mut pipe = redis::pipe();
        for (key, _) in wanted {
            pipe.cmd("TYPE").arg(key);
        }
        let mut conn = self.shared.redis.conn.clone();
        let found: Vec<String> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::from_redis(e, "checking the group's keys (TYPE)", stream))?;
        for ((key, wanted), found) in wanted.into_iter().zip(found) {
            if found != "none" && found != wanted {
                return Err(Error::Conflict {
                    reason: format!(
                        "key `{key}` holds a {found}, but the group needs a {wanted} there; delete it or pick another name"
                    ),
                });
            }
        }
        Ok(())
    }

    async fn open_group(&self, sub: &Subscription, stream: &str) -> Result<(), Error> {
        let mut conn = self.shared.redis.conn.clone();
        let created: Result<(), redis::RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream)
            .arg(&sub.group)
            .arg(&sub.start)
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await;
        match created {
            Ok(()) => tracing::info!(stream, group = %sub.group, start = %sub.start, "group created"),
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(Error::from_redis(e, "creating the group (XGROUP CREATE)", stream)),
        }
        redis::cmd("XGROUP")
            .arg("CREATECONSUMER")
            .arg(stream)
            .arg(&sub.group)
            .arg(&self.shared.consumer)
            .query_async::<i64>(&mut conn)
            .await
            .map_err(|e| Error::from_redis(e, "registering the consumer (XGROUP CREATECONSUMER)", stream))?;
        Ok(())
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
            let attach = Command::Attach {
                session,
                shard,
                policy: Policy { max_in_flight: share, ..policy.clone() },
                group: group_policy.clone(),
                events: events.clone(),
                reply,
            };
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

/// A validated subscribe.
struct Subscription {
    /// The stream as subscribed: a stream key, or a sharded stream's name.
    stream: String,
    /// The stream keys consumed (the shards of a sharded stream, else the
    /// stream itself), each with its group settings.
    shards: Vec<(String, GroupPolicy)>,
    group: String,
    /// The XGROUP CREATE start argument.
    start: String,
    /// At-most-once mode.
    no_ack: bool,
}

/// How far in the future a GROUP_START_INSTANT may lie: clock skew between
/// the client and Redis, not a schedule.
const START_TIME_SKEW: Duration = Duration::from_secs(60);

/// The longest delay or deadline a request may name: far beyond any sane
/// retry, and far from the overflow of `Instant` arithmetic.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// A proto Duration as a std one; `None` when unset. INVALID_ARGUMENT when
/// negative, malformed (nanos outside 0..1e9) or over [`MAX_DURATION`]. Checked
/// by hand: prost's conversion negates, which overflows on `i64::MIN`.
pub(crate) fn duration(field: &'static str, value: Option<prost_types::Duration>) -> Result<Option<Duration>, Error> {
    let Some(value) = value else { return Ok(None) };
    if value.seconds < 0 || value.nanos < 0 {
        return Err(Error::invalid(field, "must not be negative"));
    }
    if value.nanos >= 1_000_000_000 {
        return Err(Error::invalid(field, "nanos must be below 1,000,000,000"));
    }
    let duration = Duration::new(value.seconds as u64, value.nanos as u32);
    if duration > MAX_DURATION {
        return Err(Error::invalid(field, "must be at most 365 days"));
    }
    Ok(Some(duration))
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
        let subscribe = match first.map_err(crate::error::resource_exhausted_if_oversized)? {
            Some(ConsumeRequest { kind: Some(Kind::Subscribe(subscribe)) }) => subscribe,
            Some(_) => {
                return Err(
                    Error::invalid("subscribe", "the first message of a Consume call must be a subscribe").into()
                )
            }
            None => return Err(Error::invalid("subscribe", "the call closed before its subscribe").into()),
        };
        let (sub, policy) = self.validate(caller.as_ref(), subscribe)?;
        // Held for the life of the call.
        let permit = self.calls.clone().try_acquire_owned().map_err(|_| Error::ResourceExhausted {
            reason: format!(
                "this sidecar already serves its limit of {} Consume calls (--max-consume-calls)",
                self.max_calls
            ),
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
        tokio::spawn(async move {
            // Should the relay ever panic, its call's entries must not stay
            // held: the worker is told the call ended, as on any other end.
            let detach = workers.clone();
            let shards = session::Shards::new(workers);
            let relay = tokio::spawn(session::relay(session, inbound, events, outbound, shards, closing));
            if let Err(e) = relay.await {
                tracing::error!(session, "a call's relay failed: {e}; its entries go back to the PEL");
                for worker in detach {
                    let (flushed, _) = oneshot::channel();
                    let _ = worker.send(Command::Detach { session, flushed }).await;
                }
            }
            drop(permit);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(outbound_rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_start_is_exclusive_of_the_millisecond_before() {
        let id = StreamId { ms: 1000, seq: 0 }.predecessor().unwrap();
        assert_eq!(id.to_string(), "999-18446744073709551615");
    }

    #[test]
    fn durations_are_checked_without_overflow() {
        let d = |seconds, nanos| duration("f", Some(prost_types::Duration { seconds, nanos }));
        assert!(d(-1, 0).is_err());
        assert!(d(i64::MIN, 0).is_err());
        assert!(d(0, i32::MIN).is_err());
        assert!(d(i64::MAX, 999_999_999).is_err());
        assert!(d(0, 1_000_000_000).is_err());
        assert_eq!(d(1, 5).unwrap(), Some(Duration::new(1, 5)));
        assert_eq!(duration("f", None).unwrap(), None);
    }
}
