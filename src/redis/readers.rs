//! The group readers' connections: a bounded pool of dedicated connections
//! for `XREADGROUP … BLOCK`, whose response timeout is the BLOCK time plus the
//! Redis timeout (redis-rs' default timeout would cut a blocked read short
//! while Redis hands it entries; none at all would leave a reader waiting for
//! ever on a black-holed or stalled Redis). A read that times out marks its
//! connection broken: the next read goes out on a new one.
//!
//! The pool is deadpool's managed pool, with a manager of our own: to a
//! single server over plain TCP it makes a [`RespConnection`] (which parses
//! `XREADGROUP` replies straight into entries); otherwise (`rediss://`,
//! `redis+unix://`, a cluster) it makes one as [`Redis::dedicated`] does, TLS
//! with the configured CA. Either is named `echomq-reader` (so `CLIENT LIST`
//! tells readers apart) and health-checked with `PING` before an idle one is
//! handed out again.
//!
//! A sidecar has up to two such pools, one per way a group's reader waits
//! (`--shared-readers`, see [`super::wake`]):
//!
//! - **Blocking readers** (`--reader-connections`, 64 unless set): one
//!   connection per (stream, group) whose reader blocks (a sharded stream:
//!   one per shard), held while the group has calls on this sidecar. With
//!   `off` (and on a cluster) every group's reader blocks and takes its
//!   connection when its first call subscribes ([`ReaderPool::acquire`]): a
//!   subscribe that finds none free within [`READER_WAIT`] is refused
//!   RESOURCE_EXHAUSTED, naming the setting (more groups than connections is
//!   a refusal the client sees at once, never a call that waits for ever).
//!   With `auto`, a group read by many sidecars takes one only if one is free
//!   at once ([`ReaderPool::try_acquire`]), and shares otherwise.
//! - **Shared readers** (`--shared-reader-connections`, 2 unless set): a
//!   connection is taken for one non-blocking `XREADGROUP` and given back at
//!   once ([`ReaderPool::acquire_for_read`]), so a few serve any number of
//!   groups: a read waits for a free one, nothing is refused. Each reply is
//!   awaited for at most `--redis-timeout-ms` (nothing blocks), and an idle
//!   connection is checked with `PING` only when it was idle longer than
//!   [`SHARED_PING_IDLE`] (a `PING` per read would double the commands).
//!
//! The `echomq_reader_connection*` gauges are both pools' counts summed.
//!
//! A connection is handed back to the pool only between reads. A reader cut
//! off during a read (its last call left) has a reply still in flight: that
//! connection is closed instead, so Redis drops the read rather than hand
//! entries to a group nobody reads for, and the next read never queues
//! behind it.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use deadpool::{
    managed::{self, Object, Pool, PoolError, RecycleError, TimeoutType},
    Runtime,
};
use redis::{Cmd, ConnectionAddr, RedisError, RedisResult, Value};
use tracing::{debug, warn};

use super::{
    connect::{Connection, Redis, Target},
    fault::refuses_credentials,
    reply::{parse_read_reply, RawEntry},
    resp::RespConnection,
};
use crate::error::Error;

/// How long a group's first call waits for a reader connection to come free
/// before its subscribe is refused.
pub const READER_WAIT: Duration = Duration::from_secs(1);

/// With shared readers, an idle connection is checked with `PING` before
/// reuse only when it was idle at least this long: one reused sooner was
/// answering a moment ago, and a dead one fails its read, which is then
/// treated as any lost read (recovered, retried on a new connection).
pub const SHARED_PING_IDLE: Duration = Duration::from_secs(1);

/// The name every reader connection gives itself (`CLIENT SETNAME`).
pub const READER_CLIENT_NAME: &str = "echomq-reader";

/// Labels of closed reader connections: why the connection was closed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `health_check` (PING failed when it was to be reused), `read_error` (a
    /// read failed on it; replaced), `stopped_mid_read` (its reader was cut
    /// off during a blocked read, so it was not handed to another group),
    /// `primary_switch` (idle, it reached a primary that was since replaced).
    pub reason: &'static str,
}

impl ReasonLabels {
    /// Every reason a reader connection is closed for.
    pub const ALL: [&'static str; 4] = ["health_check", "read_error", "stopped_mid_read", "primary_switch"];
}

/// The reader pool's state at a scrape (connections), as [`ReaderPoolMetrics::refresh`] reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderPoolStatus {
    /// The pool's bound (`--reader-connections`).
    pub max: usize,
    /// Connections open: in use and idle.
    pub open: usize,
    /// Connections held by group readers.
    pub in_use: usize,
    /// Groups waiting for a connection now.
    pub waiting: usize,
}

type ReaderPoolSource = Box<dyn Fn() -> ReaderPoolStatus + Send + Sync>;

/// The reader pool's series (`echomq_reader_connection*`), registered here
/// beside the pool that records them. Cheap to clone.
#[derive(Clone)]
pub struct ReaderPoolMetrics {
    /// `echomq_reader_connections_max`: the pool's bound.
    max: Gauge,
    /// `echomq_reader_connections`: open, in use and idle.
    open: Gauge,
    /// `echomq_reader_connections_in_use`.
    in_use: Gauge,
    /// `echomq_reader_connection_waiters`.
    waiting: Gauge,
    /// `echomq_reader_connection_wait_seconds`: how long a group's first call
    /// waited for a reader connection (a free one, or a new one connected), refused or not.
    wait_seconds: Histogram,
    /// `echomq_reader_connection_refusals_total`: subscribes refused
    /// RESOURCE_EXHAUSTED because every reader connection was in use.
    refusals: Counter,
    /// `echomq_reader_connections_closed_total{reason}`.
    closed: Family<ReasonLabels, Counter>,
    /// Read at each scrape, one per pool (blocking and shared), summed: the
    /// pools' own counts, never copied by hand.
    sources: Arc<Mutex<Vec<ReaderPoolSource>>>,
}

impl ReaderPoolMetrics {
    /// Creates the series and registers them in `registry` (the `echomq_` one).
    pub fn register(registry: &mut Registry) -> ReaderPoolMetrics {
        let metrics = ReaderPoolMetrics {
            max: Gauge::default(),
            open: Gauge::default(),
            in_use: Gauge::default(),
            waiting: Gauge::default(),
            wait_seconds: super::timed::latency_histogram(),
            refusals: Counter::default(),
            closed: Family::default(),
            sources: Arc::default(),
        };
        registry.register(
            "reader_connections_max",
            "Most dedicated reader connections (--reader-connections)",
            metrics.max.clone(),
        );
        registry.register(
            "reader_connections",
            "Dedicated reader connections open (XREADGROUP BLOCK), in use and idle",
            metrics.open.clone(),
        );
        registry.register(
            "reader_connections_in_use",
            "Reader connections held by groups with calls",
            metrics.in_use.clone(),
        );
        registry.register(
            "reader_connection_waiters",
            "Groups waiting for a reader connection now",
            metrics.waiting.clone(),
        );
        registry.register(
            "reader_connection_wait_seconds",
            "Time a group's first call waited for a reader connection (free or newly connected)",
            metrics.wait_seconds.clone(),
        );
        registry.register(
            "reader_connection_refusals",
            "Subscribes refused RESOURCE_EXHAUSTED: every reader connection was in use",
            metrics.refusals.clone(),
        );
        // Every reason from the start, so a rate over them needs no first event.
        for reason in ReasonLabels::ALL {
            let _ = metrics.closed.get_or_create(&ReasonLabels { reason });
        }
        registry.register(
            "reader_connections_closed",
            "Reader connections closed, by reason (health_check, read_error, stopped_mid_read, primary_switch)",
            metrics.closed.clone(),
        );
        metrics
    }

    /// Adds a pool's state, read from `source` at each scrape, to the gauges,
    /// so they are the pools' own counts, never a copy kept in step by hand.
    fn watch(&self, source: impl Fn() -> ReaderPoolStatus + Send + Sync + 'static) {
        self.sources.lock().expect("reader pool source lock").push(Box::new(source));
    }

    /// Sets the gauges from the pools' state now (the blocking and the shared
    /// pool summed); called before each scrape.
    pub fn refresh(&self) {
        let sources = self.sources.lock().expect("reader pool source lock");
        let status =
            sources.iter().map(|source| source()).fold(ReaderPoolStatus::default(), |sum, one| ReaderPoolStatus {
                max: sum.max + one.max,
                open: sum.open + one.open,
                in_use: sum.in_use + one.in_use,
                waiting: sum.waiting + one.waiting,
            });
        self.max.set(status.max as i64);
        self.open.set(status.open as i64);
        self.in_use.set(status.in_use as i64);
        self.waiting.set(status.waiting as i64);
    }

    /// Counts a reader connection closed for `reason` (see [`ReasonLabels`]).
    fn closed(&self, reason: &'static str) {
        self.closed.get_or_create(&ReasonLabels { reason }).inc();
    }
}

/// The bounded pool of reader connections. Cheap to clone (one pool).
#[derive(Clone)]
pub struct ReaderPool {
    pool: Pool<Manager>,
    max: usize,
    metrics: ReaderPoolMetrics,
}

impl ReaderPool {
    /// A pool of at most `max` connections to `redis` (`--reader-connections`),
    /// each connected within `timeout` (and health-checked within it). For
    /// blocking readers (`shared` false) each read is given up after
    /// `read_block` (`--read-block-ms`) plus `timeout` without a reply; for
    /// shared readers (non-blocking reads) after `timeout`. Its gauges are
    /// read into `metrics` at each scrape. Connects nothing yet.
    pub fn new(
        redis: Redis,
        max: usize,
        timeout: Duration,
        read_block: Duration,
        shared: bool,
        metrics: &impl AsRef<ReaderPoolMetrics>,
    ) -> ReaderPool {
        let metrics = metrics.as_ref();
        let read_timeout = if shared { timeout } else { read_block + timeout };
        let manager = Manager { redis, timeout, read_timeout, shared, metrics: metrics.clone() };
        let pool = Pool::builder(manager)
            .max_size(max)
            .runtime(Runtime::Tokio1)
            // Shared: a read waits its turn, however long the queue.
            .wait_timeout((!shared).then_some(READER_WAIT))
            .build()
            .expect("a pool with a runtime for its wait timeout builds");
        let weak = pool.weak();
        metrics.watch(move || {
            weak.upgrade().map_or_else(ReaderPoolStatus::default, |pool| {
                let status = pool.status();
                ReaderPoolStatus {
                    max: status.max_size,
                    open: status.size,
                    in_use: status.size - status.available,
                    waiting: status.waiting,
                }
            })
        });
        ReaderPool { pool, max, metrics: metrics.clone() }
    }

    /// The most connections the pool holds (`--reader-connections`).
    pub fn max(&self) -> usize {
        self.max
    }

    /// A connection for one non-blocking read of a shared reader: an idle
    /// one (after a `PING` if idle longer than [`SHARED_PING_IDLE`]), or a
    /// new one, waiting as long as it takes for one to come free. Drop it
    /// right after the read: it goes back to the pool (or is closed, if the
    /// read broke or was cut off).
    ///
    /// Errors: a new connection cannot be made (the cause, as from
    /// [`Redis::dedicated`]); the pool was closed.
    ///
    /// Each of these acquisitions boxes the pool's wait: it holds the making
    /// of a connection (about 8 KB of future), which inline would be room
    /// kept in every group worker's task and waiting read for as long as it lives.
    pub async fn acquire_for_read(&self) -> RedisResult<ReaderConnection> {
        let started = Instant::now();
        let got = Box::pin(self.pool.get()).await;
        self.metrics.wait_seconds.observe(started.elapsed().as_secs_f64());
        match got {
            Ok(object) => Ok(ReaderConnection { object: Some(object), state: State::Ready, pool: self.clone() }),
            Err(PoolError::Backend(source)) => Err(source),
            Err(other) => Err(RedisError::from((redis::ErrorKind::Io, "the reader pool failed", other.to_string()))),
        }
    }

    /// A connection for a group reader that would rather block, if one can be
    /// had at once (an idle one, after a `PING`, or a new one while the pool
    /// has room); `None` when all are in use, without a wait, a refusal or a
    /// count: the group reads shared instead. Also `None` when a new one
    /// cannot be made (logged at debug): the group goes on sharing.
    pub async fn try_acquire(&self) -> Option<ReaderConnection> {
        let now = managed::Timeouts { wait: Some(Duration::ZERO), ..managed::Timeouts::default() };
        match Box::pin(self.pool.timeout_get(&now)).await {
            Ok(object) => Some(ReaderConnection { object: Some(object), state: State::Ready, pool: self.clone() }),
            Err(PoolError::Timeout(TimeoutType::Wait) | PoolError::Closed) => None,
            Err(e) => {
                debug!("no blocking reader connection could be made ({e}); the group's reads stay shared");
                None
            }
        }
    }

    /// A connection for the reader of `group` on `stream`: an idle one,
    /// after a `PING` (a dead one is closed and replaced), or a new one,
    /// waiting up to [`READER_WAIT`] for one to come free.
    ///
    /// Errors: RESOURCE_EXHAUSTED ([`Error::ResourceExhausted`], naming
    /// `--reader-connections`) when all are in use for that long, logged and
    /// counted in `echomq_reader_connection_refusals_total`; UNAVAILABLE
    /// ([`Error::Unavailable`]) when a new connection cannot be made.
    pub async fn acquire(&self, stream: &str, group: &str) -> Result<ReaderConnection, Error> {
        let started = Instant::now();
        let got = Box::pin(self.pool.get()).await;
        self.metrics.wait_seconds.observe(started.elapsed().as_secs_f64());
        let context = || format!("connecting the reader of group `{group}` on stream `{stream}`");
        match got {
            Ok(object) => Ok(ReaderConnection { object: Some(object), state: State::Ready, pool: self.clone() }),
            Err(PoolError::Timeout(TimeoutType::Wait)) => {
                self.metrics.refusals.inc();
                warn!(
                    stream,
                    group,
                    max = self.max,
                    "refusing a subscribe: every reader connection is in use (--reader-connections)"
                );
                Err(Error::ResourceExhausted {
                    reason: format!(
                        "all {} of this sidecar's reader connections (--reader-connections / \
                         ECHOMQ_READER_CONNECTIONS) are in use, none came free within {READER_WAIT:?}: each \
                         stream and group with calls here holds one for its blocking read (a sharded stream one \
                         per shard); subscribe again once another group's last call has ended, or raise the setting",
                        self.max
                    ),
                })
            }
            Err(PoolError::Backend(source)) => Err(Error::Unavailable { context: context(), source }),
            Err(PoolError::Closed) => Err(Error::ShuttingDown),
            // No create or recycle timeout is set (the manager bounds its own
            // steps) and no hook: what is left is a pool error of no other kind.
            Err(other) => Err(Error::Unavailable {
                context: context(),
                source: RedisError::from((redis::ErrorKind::Io, "the reader pool failed", other.to_string())),
            }),
        }
    }
}

/// Makes and checks reader connections for the pool.
struct Manager {
    redis: Redis,
    /// Bounds connecting and the health check's PING.
    timeout: Duration,
    /// Bounds each reply on the connection: the BLOCK time plus `timeout`
    /// (blocking readers), or `timeout` (shared readers).
    read_timeout: Duration,
    /// Shared readers: skip the `PING` of a connection used within [`SHARED_PING_IDLE`].
    shared: bool,
    metrics: ReaderPoolMetrics,
}

impl Manager {
    /// A new reader connection, named [`READER_CLIENT_NAME`], to the primary
    /// now. The name is a courtesy to operators: a connection that cannot
    /// take it still reads.
    ///
    /// Errors: connecting failed; the primary is changing.
    async fn connect(&self) -> RedisResult<ReaderLink> {
        if let Target::Single(primary) = &self.redis.target {
            let (generation, client) = primary.connectable()?;
            let info = client.get_connection_info();
            if let ConnectionAddr::Tcp(host, port) = info.addr() {
                let settings = info.redis_settings();
                let conn =
                    RespConnection::connect(host, *port, settings, READER_CLIENT_NAME, self.timeout, self.read_timeout)
                        .await
                        .inspect_err(|e| {
                            if refuses_credentials(e) {
                                primary.credentials_refused();
                            }
                        })?;
                return Ok(ReaderLink::Resp(conn, generation));
            }
        }
        let mut conn = self.redis.dedicated(self.timeout, Some(self.read_timeout)).await?;
        let mut naming = redis::cmd("CLIENT");
        naming.arg("SETNAME").arg(READER_CLIENT_NAME);
        match tokio::time::timeout(self.timeout, naming.query_async::<Value>(&mut conn)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => debug!("a reader connection could not name itself ({e}); it reads all the same"),
            Err(_) => debug!("a reader connection did not answer CLIENT SETNAME in time; it reads all the same"),
        }
        Ok(ReaderLink::Redis(conn))
    }
}

/// A reader connection of either make (see the module doc).
enum ReaderLink {
    /// Plain TCP to a single server: replies parsed straight into entries;
    /// made at this generation of the primary.
    Resp(RespConnection, u64),
    /// redis-rs' connection: TLS, a unix socket, or a cluster.
    Redis(Connection),
}

impl ReaderLink {
    async fn read(&mut self, read: &Cmd) -> RedisResult<Vec<RawEntry>> {
        match self {
            ReaderLink::Resp(conn, _) => conn.read_entries(read).await,
            ReaderLink::Redis(conn) => parse_read_reply(read.query_async::<Value>(conn).await?),
        }
    }

    /// The primary's generation it was made at; `None` on a cluster.
    fn generation(&self) -> Option<u64> {
        match self {
            ReaderLink::Resp(_, generation) => Some(*generation),
            ReaderLink::Redis(Connection::Dedicated(conn)) => Some(conn.generation),
            ReaderLink::Redis(_) => None,
        }
    }

    /// `PING` (on a cluster, every primary), answered within `timeout`.
    async fn ping(&mut self, timeout: Duration) -> RedisResult<()> {
        match self {
            ReaderLink::Resp(conn, _) => conn.ping(timeout).await,
            ReaderLink::Redis(conn) => {
                match tokio::time::timeout(timeout, redis::cmd("PING").query_async::<Value>(conn)).await {
                    Ok(reply) => reply.map(drop),
                    Err(_) => Err(super::resp::timed_out()),
                }
            }
        }
    }
}

impl Manager {
    /// The primary's generation now; `None` on a cluster.
    fn generation(&self) -> Option<u64> {
        self.redis.primary().map(|primary| primary.generation())
    }
}

impl managed::Manager for Manager {
    type Type = ReaderLink;
    type Error = RedisError;

    async fn create(&self) -> RedisResult<ReaderLink> {
        self.connect().await
    }

    /// The health check before an idle connection is reused: `PING` (on a
    /// cluster, every primary), within the timeout; for shared readers only
    /// after [`SHARED_PING_IDLE`] idle. On failure deadpool closes it and
    /// makes a new one.
    async fn recycle(&self, conn: &mut ReaderLink, used: &managed::Metrics) -> managed::RecycleResult<RedisError> {
        if conn.generation() != self.generation() {
            self.metrics.closed("primary_switch");
            debug!("an idle reader connection reaches the old primary; replacing it");
            return Err(RecycleError::message("made before the primary switched"));
        }
        if self.shared && used.last_used() < SHARED_PING_IDLE {
            return Ok(());
        }
        let Err(failure) = conn.ping(self.timeout).await else { return Ok(()) };
        self.metrics.closed("health_check");
        debug!("an idle reader connection failed its health check ({failure}); replacing it");
        Err(RecycleError::Backend(failure))
    }
}

/// Where a reader connection stands, which decides what dropping it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Between reads: back to the pool when dropped.
    Ready,
    /// A read was sent and its reply has not arrived: closed when dropped.
    Reading,
    /// A read failed on it (connection error): reconnected before the next
    /// read, closed when dropped.
    Broken,
}

/// One group reader's connection, taken from the [`ReaderPool`] for as long
/// as the group has calls. Dropping it gives it back, unless a read is in
/// flight or it broke: then it is closed (see the module doc).
pub struct ReaderConnection {
    /// `Some` until dropped.
    object: Option<Object<Manager>>,
    state: State,
    /// For reconnecting in place and counting closes.
    pool: ReaderPool,
}

impl ReaderConnection {
    /// Sends `read` (the group's `XREADGROUP … BLOCK`) and waits for its
    /// entries for as long as it blocks (none when the BLOCK time passed).
    /// A connection that broke on an earlier read is replaced first, in
    /// place: the group keeps its place in the pool (giving it back and
    /// queueing again could lose it to a newcomer and leave this group's
    /// calls without a reader).
    ///
    /// Errors: connecting anew, the command's own error, or a Parse error for
    /// a reply of another shape (that and a connection error mark the
    /// connection broken, counted in
    /// `echomq_reader_connections_closed_total{reason="read_error"}`).
    pub async fn read(&mut self, read: &Cmd) -> RedisResult<Vec<RawEntry>> {
        let object = self.object.as_mut().expect("present until dropped");
        let manager = self.pool.pool.manager();
        if self.state == State::Broken || object.generation() != manager.generation() {
            **object = manager.connect().await?;
            self.state = State::Ready;
        }
        self.state = State::Reading;
        // A read blocked on a primary that stopped being one may never be
        // answered (a stopped process, a partition): a switch cuts it off.
        let result = match (manager.redis.primary(), object.generation()) {
            (Some(primary), Some(generation)) => primary.run(generation, object.read(read)).await,
            _ => object.read(read).await,
        };
        self.state = match &result {
            // After a reply it could not parse, where the next one starts is unknown.
            Err(e) if crate::error::is_transient(e) || e.kind() == redis::ErrorKind::Parse => {
                self.pool.metrics.closed("read_error");
                State::Broken
            }
            _ => State::Ready,
        };
        result
    }
}

impl Drop for ReaderConnection {
    fn drop(&mut self) {
        let Some(object) = self.object.take() else { return };
        match self.state {
            // Health-checked before its next use.
            State::Ready => drop(object),
            State::Reading => {
                self.pool.metrics.closed("stopped_mid_read");
                drop(Object::take(object));
            }
            // Counted when it broke.
            State::Broken => drop(Object::take(object)),
        }
    }
}
