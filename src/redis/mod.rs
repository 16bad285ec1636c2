//! Redis connections, the server-side scripts, and stream reply parsing.
//!
//! Two kinds of connection, to a single Redis server or to a Redis Cluster:
//! - one shared, multiplexed connection (it reconnects by itself; on a cluster
//!   it follows MOVED/ASK and topology changes) for every non-blocking command,
//!   with a response timeout (`--redis-timeout-ms`); on a single server, a
//!   command that gets no reply in time retires the connection ([`shared`]);
//! - one dedicated connection per group reader for `XREADGROUP … BLOCK`, whose
//!   response timeout is the BLOCK time plus `--redis-timeout-ms`, so a blocking
//!   read never holds up other commands, is never cut short while Redis is
//!   handing entries to it, and still ends when Redis has gone silent. On a
//!   cluster it is a cluster connection of its own, routed to the node that
//!   owns the stream's slot. They come from a bounded pool, [`readers`].
//!
//! Every socket to Redis has TCP keepalive on ([`TCP_KEEPALIVE_IDLE`]), so an
//! idle connection to a peer that vanished (a host gone, a partition that
//! drops packets) fails within about 25 s instead of the kernel's two hours.
//!
//! What that bounds (`docs/src/operations.md`, "When Redis goes silent"):
//! a black-holed or stalled Redis turns readiness NOT_SERVING within one
//! readiness interval (1 s) plus `--redis-timeout-ms`; a blocked reader gives
//! up within `--read-block-ms` plus `--redis-timeout-ms` and reconnects.

pub mod primary;
pub mod readers;
pub mod resp;
pub mod shared;

pub mod fault;
pub mod group;
pub mod range;
pub mod trim;
pub mod version;

pub use fault::{fault, Fault};

use std::{sync::Arc, time::Duration};

pub use shared::SharedConnection;

use redis::{
    aio::{ConnectionLike, ConnectionManagerConfig, MultiplexedConnection},
    cluster::{ClusterClient, ClusterClientBuilder},
    cluster_async::ClusterConnection,
    AsyncConnectionConfig, Client, ConnectionInfo, IntoConnectionInfo, RedisFuture, RedisResult, Script, Value,
};

use crate::{
    error::Error,
    id::StreamId,
    keys::Keyspace,
    metrics::{Metrics, TimedConnection},
};

/// A connection to a single Redis server or to a Redis Cluster.
#[derive(Clone)]
pub enum Connection {
    /// The shared connection to a single server: reconnects by itself, and
    /// is replaced after a response timeout.
    Managed(SharedConnection),
    /// A connection of its own to a single server's primary (a reader's, a
    /// durable writer's): a reply that says its node is no longer the
    /// primary starts a switch ([`primary::Primary::observe`]).
    Dedicated(DedicatedConnection),
    /// A connection to a cluster: routes each command to the node that owns
    /// its key's slot, following MOVED/ASK and topology changes.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Managed(c) => c.req_packed_command(cmd),
            Connection::Dedicated(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Managed(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Dedicated(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Managed(c) => c.get_db(),
            Connection::Dedicated(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// A dedicated connection to a single server, made at one generation of the
/// [`primary::Primary`]; its replies are observed for a switch of primary.
#[derive(Clone)]
pub struct DedicatedConnection {
    conn: MultiplexedConnection,
    generation: u64,
    primary: Arc<primary::Primary>,
}

impl DedicatedConnection {
    /// Whether the primary has switched since this connection was made (it
    /// then reaches the old one: make a new connection).
    pub fn is_stale(&self) -> bool {
        self.primary.generation() != self.generation
    }
}

impl ConnectionLike for DedicatedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move { self.primary.run(self.generation, self.conn.req_packed_command(cmd)).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.primary.run(self.generation, self.conn.req_packed_commands(pipeline, offset, count)).await
        })
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// How new connections are made.
#[derive(Clone)]
enum Target {
    /// A single server's primary, followed through switches.
    Single(Arc<primary::Primary>),
    /// The configured seeds and the CA for `rediss://`; readers' connections
    /// are seeded with the cluster's current primaries too, so a reader can
    /// reconnect after the node it was given as a seed has died.
    Cluster { seeds: Vec<ConnectionInfo>, ca_pem: Option<Vec<u8>> },
}

/// The shared Redis handles.
#[derive(Clone)]
pub struct Redis {
    target: Target,
    /// The shared multiplexed connection for non-blocking commands, every
    /// command's latency observed.
    pub conn: TimedConnection<Connection>,
    /// The loaded scripts (EVALSHA, falling back to EVAL after a Redis restart).
    pub scripts: Scripts,
    /// Key names: derived keys, shard keys.
    pub keys: Arc<Keyspace>,
    /// What the server said it is at start ([`Redis::check_server_version`]),
    /// for the few steps that differ by version; `None` until then, or when
    /// it would not say.
    pub server: Option<version::Server>,
}

impl Redis {
    /// Opens the shared connection. `urls` is one URL, a comma-separated
    /// seed list of cluster nodes, or a `redis+sentinel://` URL
    /// ([`primary::SentinelUrl`]); a single URL whose server has cluster mode
    /// on (`INFO cluster`: `cluster_enabled:1`) is used as the seed of a
    /// cluster, so the sidecar runs on a cluster unchanged. On a single
    /// server, the primary is followed through failovers ([`primary`]).
    /// `options` carries the credentials, CA, timeout and sharded streams.
    ///
    /// Errors: an invalid URL, or no Sentinel usable (`InvalidClientConfig`:
    /// a setting to fix), or Redis cannot be reached or refuses the
    /// credentials now.
    pub async fn connect(urls: &str, options: ConnectOptions<'_>, metrics: Arc<Metrics>) -> RedisResult<Redis> {
        let ConnectOptions { password, ca_pem, timeout, sharded, sentinel_username, sentinel_password } = options;
        let scripts = Scripts::new();
        let manager_config = || {
            ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_secs(2))
        };
        if primary::SentinelUrl::is_sentinel(urls.trim()) {
            let url = primary::SentinelUrl::parse(urls.trim()).map_err(|reason| {
                redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "bad Sentinel URL", reason))
            })?;
            let sentinels =
                primary::Sentinels::new(&url, sentinel_username, sentinel_password, password, ca_pem, tcp_settings())?;
            let primary =
                primary::Primary::start(primary::Locator::Sentinel(sentinels), timeout, metrics.primary()).await?;
            return Redis::single(primary, manager_config(), timeout, scripts, metrics, sharded.clone()).await;
        }
        let seeds = urls
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(|url| Ok(with_password(url.into_connection_info()?, password)?.set_tcp_settings(tcp_settings())))
            .collect::<RedisResult<Vec<ConnectionInfo>>>()?;
        let Some(first) = seeds.first().cloned() else {
            return Err((redis::ErrorKind::InvalidClientConfig, "no Redis URL given").into());
        };
        let client = primary::client_for(first.clone(), ca_pem)?;
        let cluster = seeds.len() > 1 || cluster_enabled(&client, timeout).await?;
        if cluster && seeds.iter().any(|seed| seed.redis_settings().db() != 0) {
            let reason = "a Redis Cluster has only database 0: drop the /<db> from the URL";
            return Err((redis::ErrorKind::InvalidClientConfig, reason).into());
        }
        if !cluster {
            let locator = primary::Locator::Address { info: first, ca_pem: ca_pem.map(<[u8]>::to_vec) };
            let primary = primary::Primary::start(locator, timeout, metrics.primary()).await?;
            return Redis::single(primary, manager_config(), timeout, scripts, metrics, sharded.clone()).await;
        }
        let mut conn = cluster_client(seeds.clone(), timeout, Some(timeout), ca_pem)?.get_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok(Redis {
            target: Target::Cluster { seeds, ca_pem: ca_pem.map(<[u8]>::to_vec) },
            conn: TimedConnection::new(Connection::Cluster(conn), metrics, scripts.names()),
            scripts,
            keys: Arc::new(Keyspace::new(true, sharded.clone())),
            server: None,
        })
    }

    /// The handles of a single server whose primary is `primary`.
    async fn single(
        primary: Arc<primary::Primary>,
        config: ConnectionManagerConfig,
        timeout: Duration,
        scripts: Scripts,
        metrics: Arc<Metrics>,
        sharded: std::collections::BTreeMap<String, u32>,
    ) -> RedisResult<Redis> {
        let mut conn = SharedConnection::connect(primary.clone(), config, timeout).await?;
        // Connecting does not prove the credentials: without a password Redis
        // accepts the connection and refuses every command (NOAUTH).
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok(Redis {
            target: Target::Single(primary),
            conn: TimedConnection::new(Connection::Managed(conn), metrics, scripts.names()),
            scripts,
            keys: Arc::new(Keyspace::new(false, sharded)),
            server: None,
        })
    }

    /// The primary followed through switches; `None` on a cluster (whose
    /// client follows its own failovers).
    pub fn primary(&self) -> Option<&Arc<primary::Primary>> {
        match &self.target {
            Target::Single(primary) => Some(primary),
            Target::Cluster { .. } => None,
        }
    }

    /// Records each sharded stream's shard count in Redis the first time
    /// (`SET <name>:shards <count> NX`, then `GET`; on a cluster `{<name>}:shards`, see
    /// [`crate::keys::Keyspace::shard_count_key`]) and checks it every time after, so
    /// sidecars configured with different counts for one stream (whose
    /// entries would sit unread in shards a consumer does not know) refuse to
    /// start instead.
    ///
    /// Errors: [`ShardCountError::Mismatch`] naming both counts and the key;
    /// [`ShardCountError::Redis`] when Redis refuses the command.
    pub async fn record_shard_counts(&self) -> Result<(), ShardCountError> {
        let mut conn = self.conn.clone();
        for (name, count) in self.keys.sharded() {
            let key = self.keys.shard_count_key(name);
            // `SET … NX GET` in one command needs Redis 7.0 (6.2 answers a syntax
            // error to NX with GET): SET NX, then GET what is recorded, which is
            // this count when the SET took and the first sidecar's when not.
            let (recorded,): (Option<String>,) = redis::pipe()
                .cmd("SET")
                .arg(&key)
                .arg(count)
                .arg("NX")
                .ignore()
                .cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .map_err(|error| ShardCountError::Redis { key: key.clone(), error })?;
            if let Some(recorded) = recorded.filter(|recorded| *recorded != count.to_string()) {
                return Err(ShardCountError::Mismatch { name: name.to_owned(), recorded, configured: count, key });
            }
        }
        Ok(())
    }

    /// INVALID_ARGUMENT (naming `field`) when `key` is shaped like a shard key
    /// of a stream that another sidecar shards (a count recorded in Redis,
    /// `GET`) but this one does not, or like a shard this sidecar's sharded
    /// stream does not have: appended here, it would get sequence numbers
    /// outside its shard's stride (branded ids could collide across shards),
    /// and a subscription would split the shard's readers. A name like
    /// `user:{user:123}` with no count recorded is an ordinary stream.
    ///
    /// Errors: those above; as [`Redis::recorded_shard_count`] when the `GET` fails.
    pub async fn refuse_foreign_shard_key(&self, field: &'static str, key: &str) -> Result<(), Error> {
        let Some(name) = self.keys.shard_key_check(field, key)? else { return Ok(()) };
        match self.recorded_shard_count(name).await? {
            None => Ok(()),
            Some(count) => Err(Error::invalid(
                field,
                format!(
                    "`{key}` is a shard key of sharded stream `{name}` ({count} shards, recorded in `{}`), which \
                     this sidecar was not started with: start it with --sharded-streams {name}={count}",
                    self.keys.shard_count_key(name)
                ),
            )),
        }
    }

    /// INVALID_ARGUMENT when `stream` names a sharded stream, configured here or
    /// recorded in Redis by other sidecars (one `GET`): for calls that work on one
    /// stream key (Read, Trim, dead letters), which must name a shard. The
    /// message lists the shard keys. Errors also as
    /// [`Redis::recorded_shard_count`] when the `GET` fails.
    pub async fn refuse_sharded(&self, field: &'static str, stream: &str) -> Result<(), Error> {
        let (count, origin) = match self.keys.shards(stream) {
            Some(shards) => (shards.len() as u32, ""),
            None => match self.recorded_shard_count(stream).await? {
                Some(count) => (count, ", recorded in Redis by the sidecars that shard it"),
                None => return Ok(()),
            },
        };
        Err(Error::invalid(
            field,
            format!(
                "`{stream}` is a sharded stream of {count} shards{origin}; name one shard's key (`{}` … `{}`)",
                crate::keys::shard_key(stream, 0),
                crate::keys::shard_key(stream, count - 1)
            ),
        ))
    }

    /// The shard count recorded for `name` by the sidecars that shard it
    /// (`GET` of [`Keyspace::shard_count_key`]); `None` when none is, or the
    /// key holds something else (another type, not a count: see
    /// [`crate::keys::is_recorded_count`]), or `name` has braces (no sharded
    /// stream has them; no query then).
    ///
    /// Errors: as [`Error::from_redis`] when Redis fails the `GET`.
    pub async fn recorded_shard_count(&self, name: &str) -> Result<Option<u32>, Error> {
        let Some(count_key) = self.keys.shard_count_key_to_check(name) else { return Ok(None) };
        let mut conn = self.conn.clone();
        let recorded: Option<String> = match redis::cmd("GET").arg(&count_key).query_async(&mut conn).await {
            Ok(recorded) => recorded,
            Err(e) if fault(&e) == Fault::WrongType => None,
            Err(e) => return Err(Error::from_redis(e, "checking the shard count (GET)", name)),
        };
        Ok(recorded.filter(|count| crate::keys::is_recorded_count(count)).and_then(|count| count.parse().ok()))
    }

    /// The server this connection reaches (`INFO server`); on a cluster, the
    /// oldest of its primaries. Errors: [`version::VersionError::TooOld`]
    /// below [`version::FLOOR`], naming what was found;
    /// [`version::VersionError::Unknown`] when no reply has a readable
    /// `redis_version`; [`version::VersionError::Redis`] when the command fails.
    /// What it found is kept in [`Redis::server`] (call it before cloning).
    pub async fn check_server_version(&mut self) -> Result<version::Server, version::VersionError> {
        let mut conn = self.conn.clone();
        let reply: Value =
            redis::cmd("INFO").arg("server").query_async(&mut conn).await.map_err(version::VersionError::Redis)?;
        let oldest = version::servers_in(&reply).into_iter().min_by_key(|server| server.redis);
        match oldest {
            Some(found) if !found.meets_floor() => Err(version::VersionError::TooOld { found }),
            Some(found) => {
                self.server = Some(found);
                Ok(found)
            }
            None => Err(version::VersionError::Unknown),
        }
    }

    /// Logs a warning for each sharded stream whose name is also a plain
    /// stream in Redis: entries of a stream that existed before it was sharded
    /// stay in that key, which the shards' consumers never read (`TYPE`).
    pub async fn warn_of_plain_namesakes(&self) {
        let mut conn = self.conn.clone();
        for (name, _) in self.keys.sharded() {
            if redis::cmd("TYPE").arg(name).query_async::<String>(&mut conn).await.is_ok_and(|t| t == "stream") {
                tracing::warn!(
                    stream = name,
                    "a plain stream named like this sharded stream exists; its entries are not read by consumers of the \
                     shards: drain it (subscribe to it before sharding) or move them"
                );
            }
        }
    }

    /// Why Redis does not serve now, `None` when it does: on a single server,
    /// the primary is not changing and `ROLE` says `master`
    /// ([`primary::Primary::unready`]); on a cluster, PING answered and
    /// `CLUSTER INFO` says `cluster_state:ok` (a cluster with slots uncovered
    /// answers PING but refuses commands on those slots).
    pub async fn unready(&self) -> Option<String> {
        let mut conn = self.conn.clone();
        if let Target::Single(primary) = &self.target {
            return primary.unready(&mut conn).await;
        }
        if let Err(e) = redis::cmd("PING").query_async::<String>(&mut conn).await {
            return Some(format!("Redis does not answer PING ({e})"));
        }
        match redis::cmd("CLUSTER").arg("INFO").query_async::<String>(&mut conn).await {
            Ok(info) => {
                let state = info.lines().find_map(|line| line.trim().strip_prefix("cluster_state:")).unwrap_or("?");
                (state != "ok")
                    .then(|| format!("the Redis Cluster says cluster_state:{state} (some slots are not served)"))
            }
            Err(e) => Some(format!("Redis does not answer CLUSTER INFO ({e})")),
        }
    }

    /// A new connection of its own for blocking reads: `connect_timeout` to
    /// connect, `response_timeout` for each reply (`None`: none; a group
    /// reader's is its BLOCK time plus `--redis-timeout-ms`, so that a read
    /// is never cut short while Redis hands it entries, yet ends when Redis
    /// has gone silent), on a single server and on a cluster alike. The group readers take theirs from [`readers::ReaderPool`], which makes
    /// them with this.
    ///
    /// On a single server it reaches the primary; once the primary switches
    /// it is stale ([`DedicatedConnection::is_stale`]): its commands answer
    /// as the old node does (a write `READONLY`, which is turned into the
    /// primary-changing error), so make a new one.
    ///
    /// Errors: connecting failed or took longer than `connect_timeout`; the
    /// primary is changing ([`primary::primary_changing`]).
    pub async fn dedicated(
        &self,
        connect_timeout: Duration,
        response_timeout: Option<Duration>,
    ) -> RedisResult<Connection> {
        match &self.target {
            Target::Single(primary) => {
                let (generation, client) = primary.connectable()?;
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(response_timeout);
                let conn = client.get_multiplexed_async_connection_with_config(&config).await?;
                Ok(Connection::Dedicated(DedicatedConnection { conn, generation, primary: primary.clone() }))
            }
            Target::Cluster { seeds, ca_pem } => {
                let mut nodes = self.primaries(&seeds[0]).await.unwrap_or_default();
                nodes.extend(seeds.iter().cloned());
                let client = cluster_client(nodes, connect_timeout, response_timeout, ca_pem.as_deref())?;
                let connecting = tokio::time::timeout(connect_timeout * 2, client.get_async_connection());
                let timed_out =
                    || redis::RedisError::from((redis::ErrorKind::Io, "connecting to the cluster timed out"));
                Ok(Connection::Cluster(connecting.await.map_err(|_| timed_out())??))
            }
        }
    }

    /// The cluster's primaries now (`CLUSTER SLOTS` on the shared connection),
    /// as connection settings shaped like `template` (credentials, TLS).
    async fn primaries(&self, template: &ConnectionInfo) -> RedisResult<Vec<ConnectionInfo>> {
        let mut conn = self.conn.clone();
        let slots: Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut conn).await?;
        let mut nodes = Vec::new();
        for range in array(&slots) {
            let primary = array(range).get(2).map(array).unwrap_or_default();
            let (Some(host), Some(Value::Int(port))) = (primary.first().and_then(|h| bytes(h).ok()), primary.get(1))
            else {
                continue;
            };
            let (Ok(host), Ok(port)) = (String::from_utf8(host), u16::try_from(*port)) else { continue };
            if host.is_empty() {
                continue;
            }
            let addr = match template.addr() {
                redis::ConnectionAddr::TcpTls { insecure, tls_params, .. } => {
                    redis::ConnectionAddr::TcpTls { host, port, insecure: *insecure, tls_params: tls_params.clone() }
                }
                _ => redis::ConnectionAddr::Tcp(host, port),
            };
            nodes.push(template.clone().set_addr(addr));
        }
        Ok(nodes)
    }
}

/// A cluster client seeded with `nodes`: `connect_timeout` per connection,
/// `response_timeout` per command (`None` for blocking reads), retries that
/// ride out a failover, `ca_pem` as the only root for `rediss://`.
fn cluster_client(
    nodes: Vec<ConnectionInfo>,
    connect_timeout: Duration,
    response_timeout: Option<Duration>,
    ca_pem: Option<&[u8]>,
) -> RedisResult<ClusterClient> {
    let mut builder = ClusterClientBuilder::new(nodes)
        .connection_timeout(connect_timeout)
        .retries(6)
        .max_retry_wait(1_000)
        .tcp_settings(tcp_settings());
    if let Some(ca) = ca_pem {
        builder = builder.certs(redis::TlsCertificates { client_tls: None, root_cert: Some(ca.to_vec()) });
    }
    match response_timeout {
        // Retries through a failover take longer than one command.
        Some(t) => builder.response_timeout(t).overall_response_timeout(Some(t * 4)),
        None => builder,
    }
    .build()
}

/// How [`Redis::connect`] connects, besides the URL. No `Debug`: it holds passwords.
#[derive(Clone, Copy)]
pub struct ConnectOptions<'a> {
    /// Overrides the URL's password for the data nodes (`--redis-password-file`).
    pub password: Option<&'a str>,
    /// The only trusted root for `rediss://` (`--redis-ca-file`); `None`: the system's.
    pub ca_pem: Option<&'a [u8]>,
    /// Bounds connecting and each non-blocking command (`--redis-timeout-ms`).
    pub timeout: Duration,
    /// The sharded streams: name → shard count (`--sharded-streams`).
    pub sharded: &'a std::collections::BTreeMap<String, u32>,
    /// The Sentinels' own ACL user (`--sentinel-username`).
    pub sentinel_username: Option<&'a str>,
    /// The Sentinels' own password (`--sentinel-password`).
    pub sentinel_password: Option<&'a str>,
}

/// Why [`Redis::record_shard_counts`] refused.
#[derive(Debug, thiserror::Error)]
pub enum ShardCountError {
    /// Redis holds another count for the stream.
    #[error(
        "sharded stream `{name}` is recorded in Redis with {recorded} shards (key `{key}`), but this sidecar is \
         configured with {configured} (--sharded-streams): every sidecar must use the same count; to change it, \
         drain the stream, stop its sidecars, DEL `{key}` and restart them with the new count"
    )]
    Mismatch {
        /// The sharded stream.
        name: String,
        /// The count Redis holds.
        recorded: String,
        /// This sidecar's count.
        configured: u32,
        /// The key holding it.
        key: String,
    },
    /// Redis refused or failed the command (`WRONGTYPE`: the key holds
    /// something else, such as a stream appended under that name).
    #[error("recording the shard count in Redis (SET `{key}` NX, GET) failed: {error}")]
    Redis {
        /// The key it was to be recorded in.
        key: String,
        /// What Redis said.
        error: redis::RedisError,
    },
}

/// How long a connection to Redis may be idle before TCP starts probing its peer.
pub const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Time between TCP keepalive probes.
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes after which the kernel closes the connection: an idle
/// connection to a vanished peer fails within idle + retries × interval = 25 s.
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// The TCP settings of every socket to Redis: no Nagle delay (commands are
/// small and latency-bound) and keepalive probes (the constants above).
fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true).set_keepalive(tcp_keepalive())
}

/// The keepalive probes of every socket to Redis (the constants above);
/// also set by the readers' own connections ([`resp`]).
fn tcp_keepalive() -> redis::io::tcp::socket2::TcpKeepalive {
    redis::io::tcp::socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_IDLE)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES)
}

fn with_password(info: ConnectionInfo, password: Option<&str>) -> RedisResult<ConnectionInfo> {
    Ok(match password {
        Some(password) => {
            let settings = info.redis_settings().clone().set_password(password);
            info.set_redis_settings(settings)
        }
        None => info,
    })
}

/// Whether the server has cluster mode on (`INFO cluster`).
async fn cluster_enabled(client: &Client, timeout: Duration) -> RedisResult<bool> {
    let config = AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(Some(timeout));
    let mut conn = client.get_multiplexed_async_connection_with_config(&config).await?;
    let info: String = redis::cmd("INFO").arg("cluster").query_async(&mut conn).await?;
    Ok(info.lines().any(|line| line.trim() == "cluster_enabled:1"))
}

/// The Lua functions every script shares (`lua/prelude.lua`): the branded
/// id's text form and the shard-count rule, the same as [`crate::id`]'s and
/// [`crate::keys::is_recorded_count`]. Prepended to each script on load.
pub const LUA_PRELUDE: &str = include_str!("lua/prelude.lua");

/// The server-side scripts, each a Lua file: the stream calls' under
/// `src/redis/lua/`, the consume path's beside their Rust wrappers in `src/consume/`.
#[derive(Clone)]
pub struct Scripts {
    /// `append.lua`: mint branded ids and XADD a batch atomically.
    pub append: Script,
    /// `consume/redeliver.lua`: claim due entries still pending for this consumer.
    pub redeliver: Script,
    /// `consume/refresh.lua`: keep the leases of held entries fresh.
    pub refresh: Script,
    /// `consume/dead_letter.lua`: move entries to the dead-letter stream.
    pub dead_letter: Script,
    /// `consume/hygiene.lua`: record this sidecar's heartbeat, remove dead consumers that hold nothing.
    pub hygiene: Script,
    /// `consume/settle.lua`: a batch of XACKs and retry-state writes in one command.
    pub settle: Script,
    /// `trim.lua`: XTRIM MINID, never past what groups still need (safe mode).
    pub trim: Script,
    /// `replay.lua`: move dead letters back to their source stream.
    pub replay: Script,
    /// `group_lag.lua`: a group's lag, exact or nil, never Redis 7.0's miscount.
    pub group_lag: Script,
    /// `lease_renew.lua`: extend the archive's fold lease while this sidecar holds it.
    pub lease_renew: Script,
    /// `lease_release.lua`: give the archive's fold lease up while this sidecar holds it.
    pub lease_release: Script,
}

impl Scripts {
    /// SHA1 → file name of every script, for labelling EVALSHA in metrics.
    fn names(&self) -> std::collections::HashMap<String, &'static str> {
        [
            (&self.append, "append"),
            (&self.redeliver, "redeliver"),
            (&self.refresh, "refresh"),
            (&self.dead_letter, "dead_letter"),
            (&self.trim, "trim"),
            (&self.settle, "settle"),
            (&self.hygiene, "hygiene"),
            (&self.replay, "replay"),
            (&self.group_lag, "group_lag"),
            (&self.lease_renew, "lease_renew"),
            (&self.lease_release, "lease_release"),
        ]
        .into_iter()
        .map(|(script, name)| (script.get_hash().to_owned(), name))
        .collect()
    }

    fn new() -> Scripts {
        let script = |body: &str| Script::new(&format!("{LUA_PRELUDE}\n{body}"));
        Scripts {
            append: script(include_str!("lua/append.lua")),
            redeliver: script(include_str!("../consume/redeliver.lua")),
            refresh: script(include_str!("../consume/refresh.lua")),
            dead_letter: script(include_str!("../consume/dead_letter.lua")),
            trim: script(include_str!("lua/trim.lua")),
            settle: script(include_str!("../consume/settle.lua")),
            hygiene: script(include_str!("../consume/hygiene.lua")),
            replay: script(include_str!("lua/replay.lua")),
            group_lag: script(include_str!("lua/group_lag.lua")),
            lease_renew: script(include_str!("lua/lease_renew.lua")),
            lease_release: script(include_str!("lua/lease_release.lua")),
        }
    }
}

/// One stream entry as Redis returned it, field names and values as bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawEntry {
    /// The entry's stream id.
    pub id: StreamId,
    /// Field name/value pairs in stream order; `None` when Redis returned the id
    /// with no body: the entry was deleted (trimmed) while pending.
    pub fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

/// Parses a list of entries (`[[id, [field, value, …]], …]`, as XRANGE, XCLAIM
/// and each stream of XREADGROUP return them). Malformed items are an error, not
/// skipped, so an entry is never silently dropped. Takes the reply by value:
/// field names and values move into the entries, uncopied (on the delivery
/// path they are most of the bytes).
pub fn parse_entries(value: Value) -> RedisResult<Vec<RawEntry>> {
    match value {
        Value::Nil => Ok(Vec::new()),
        Value::Array(items) => items.into_iter().map(parse_entry).collect(),
        other => Err(unexpected("a list of stream entries", &other)),
    }
}

/// Parses one `[id, [field, value, …]]` (or `[id, nil]`).
pub fn parse_entry(value: Value) -> RedisResult<RawEntry> {
    let Value::Array(parts) = value else {
        return Err(unexpected("a stream entry", &value));
    };
    if parts.is_empty() {
        return Err(unexpected("a stream entry", &Value::Array(parts)));
    }
    let mut parts = parts.into_iter();
    let id = parse_stream_id(&parts.next().unwrap_or(Value::Nil))?;
    let fields = match parts.next() {
        None | Some(Value::Nil) => None,
        Some(Value::Array(flat)) if flat.len() % 2 == 0 => {
            let mut fields = Vec::with_capacity(flat.len() / 2);
            let mut flat = flat.into_iter();
            while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
                fields.push((into_bytes(name)?, into_bytes(value)?));
            }
            Some(fields)
        }
        Some(other) => return Err(unexpected("an entry's field list", &other)),
    };
    Ok(RawEntry { id, fields })
}

/// Parses an XREADGROUP reply for a single stream: nil on timeout, else
/// `[[stream, entries]]` (a map under RESP3). By value, as [`parse_entries`].
pub fn parse_read_reply(value: Value) -> RedisResult<Vec<RawEntry>> {
    match value {
        Value::Nil => Ok(Vec::new()),
        Value::Array(streams) => {
            let mut entries = Vec::new();
            for stream in streams {
                match stream {
                    Value::Array(pair) if pair.len() == 2 => {
                        let list = pair.into_iter().nth(1).unwrap_or(Value::Nil);
                        if entries.is_empty() {
                            entries = parse_entries(list)?;
                        } else {
                            entries.extend(parse_entries(list)?);
                        }
                    }
                    other => return Err(unexpected("[stream, entries]", &other)),
                }
            }
            Ok(entries)
        }
        Value::Map(streams) => {
            let mut entries = Vec::new();
            for (_, list) in streams {
                entries.extend(parse_entries(list)?);
            }
            Ok(entries)
        }
        other => Err(unexpected("an XREADGROUP reply", &other)),
    }
}

/// The items of an array reply; empty for anything else (nil included).
pub fn array(value: &Value) -> &[Value] {
    match value {
        Value::Array(items) => items,
        _ => &[],
    }
}

/// One item of a script's reply shaped `{ stream id, tag, … }` (the consume
/// scripts' replies): the id, the tag, and what follows it. A malformed item
/// is an error, never skipped.
pub fn tagged(item: &Value) -> RedisResult<(StreamId, String, &[Value])> {
    let parts = array(item);
    let (Some(id), Some(tag)) = (parts.first(), parts.get(1)) else {
        return Err(unexpected("{ stream id, tag, … }", item));
    };
    let tag = String::from_utf8(bytes(tag)?).map_err(|_| unexpected("a reply tag", item))?;
    Ok((parse_stream_id(id)?, tag, &parts[2..]))
}

/// The Parse error for a [`tagged`] reply whose tag `script`'s wrapper does
/// not know: the script and its wrapper disagree.
pub fn unknown_tag(script: &str, tag: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected reply from Redis",
        format!("{script} replied `{tag}`"),
    ))
}

/// An integer reply, or a script's integer.
pub fn int(value: &Value) -> RedisResult<i64> {
    match value {
        Value::Int(n) => Ok(*n),
        other => Err(unexpected("an integer", other)),
    }
}

/// Parses a stream id given as a bulk or simple string.
pub fn parse_stream_id(value: &Value) -> RedisResult<StreamId> {
    let text = String::from_utf8(bytes(value)?).map_err(|_| unexpected("a stream id", value))?;
    text.parse().map_err(|_| unexpected("a stream id", value))
}

/// Entries a trim removed before a consumer group had been delivered them,
/// as `trim_counting_unread` (`lua/prelude.lua`) reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreadTrimmed {
    /// The consumer group that lost them.
    pub group: String,
    /// How many (entries); `None`: more than the script could count (it reads
    /// at most 100,000 ids ahead), never a guess.
    pub entries: Option<u64>,
}

/// Parses the flat `{ group, count, … }` list of `trim_counting_unread`.
pub fn parse_unread_trimmed(value: &Value) -> RedisResult<Vec<UnreadTrimmed>> {
    let Value::Array(items) = value else {
        return Err(unexpected("a list of groups and counts", value));
    };
    items
        .chunks(2)
        .map(|pair| match pair {
            [group, Value::Int(count)] => Ok(UnreadTrimmed {
                group: String::from_utf8_lossy(&bytes(group)?).into_owned(),
                entries: u64::try_from(*count).ok(),
            }),
            _ => Err(unexpected("a group and a count", value)),
        })
        .collect()
}

/// The bytes of a bulk or simple string, moved out of the reply.
fn into_bytes(value: Value) -> RedisResult<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        Value::SimpleString(text) => Ok(text.into_bytes()),
        other => bytes(&other),
    }
}

/// The bytes of a bulk or simple string.
pub fn bytes(value: &Value) -> RedisResult<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Ok(bytes.clone()),
        Value::SimpleString(text) => Ok(text.clone().into_bytes()),
        Value::Okay => Ok(b"OK".to_vec()),
        Value::Int(n) => Ok(n.to_string().into_bytes()),
        other => Err(unexpected("a string", other)),
    }
}

fn unexpected(what: &str, got: &Value) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected reply from Redis",
        format!("expected {what}, got {got:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &[u8]) -> Value {
        Value::BulkString(text.to_vec())
    }

    #[test]
    fn parses_entries_with_binary_fields_and_deleted_bodies() {
        let reply = Value::Array(vec![
            Value::Array(vec![bulk(b"1-1"), Value::Array(vec![bulk(b"\xff\x00"), bulk(b"v")])]),
            Value::Array(vec![bulk(b"2-0"), Value::Nil]),
        ]);
        let entries = parse_entries(reply).unwrap();
        assert_eq!(entries[0].id, StreamId { ms: 1, seq: 1 });
        assert_eq!(entries[0].fields, Some(vec![(b"\xff\x00".to_vec(), b"v".to_vec())]));
        assert_eq!(entries[1].fields, None);
    }

    #[test]
    fn odd_field_lists_are_an_error_not_a_drop() {
        let reply = Value::Array(vec![Value::Array(vec![bulk(b"1-1"), Value::Array(vec![bulk(b"k")])])]);
        assert!(parse_entries(reply).is_err());
    }

    #[test]
    fn read_reply_timeout_is_empty() {
        assert!(parse_read_reply(Value::Nil).unwrap().is_empty());
    }
}
