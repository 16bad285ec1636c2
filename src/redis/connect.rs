//! Connecting: the [`Redis`] handles (the shared connection, the scripts,
//! the keyspace), [`Connection`] to a single server or a cluster, dedicated
//! connections for blocking reads and the durable writer, the TCP settings
//! of every socket, readiness.

use std::{sync::Arc, time::Duration};

use redis::{
    aio::{ConnectionLike, ConnectionManagerConfig, MultiplexedConnection},
    cluster::{ClusterClient, ClusterClientBuilder},
    cluster_async::ClusterConnection,
    AsyncConnectionConfig, Client, ConnectionInfo, IntoConnectionInfo, RedisFuture, RedisResult, Value,
};

use prometheus_client::registry::Registry;

use super::{
    credentials::{with_password, PasswordFile},
    fault::refuses_credentials,
    primary::{self, PrimaryMetrics},
    reply::{array, bytes},
    scripts::Scripts,
    shared::SharedConnection,
    timed::{CommandMetrics, TimedConnection},
    version,
};
use crate::keys::Keyspace;

/// The series the connections record, each group registered by the file
/// that records it. Cheap to clone.
#[derive(Clone)]
pub struct RedisMetrics {
    /// Every command on the shared connection ([`super::timed`]).
    pub commands: CommandMetrics,
    /// The primary's switches ([`primary::Primary`]).
    pub primary: PrimaryMetrics,
}

impl RedisMetrics {
    /// Creates the series and registers them in `registry` (the `echomq_` one).
    pub fn register(registry: &mut Registry) -> RedisMetrics {
        RedisMetrics { primary: PrimaryMetrics::register(registry), commands: CommandMetrics::register(registry) }
    }
}

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
    /// The primary's generation when it was made (the readers' pool compares it).
    pub(super) generation: u64,
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
pub(super) enum Target {
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
    /// How new connections are made (the readers' pool makes its own with it).
    pub(super) target: Target,
    /// The shared multiplexed connection for non-blocking commands, every
    /// command's latency observed.
    pub conn: TimedConnection<Connection>,
    /// The loaded scripts (EVALSHA, falling back to EVAL after a Redis restart).
    /// Shared: each script holds its Lua source, about 200 KB in all, and
    /// every group worker keeps a clone of these handles.
    pub scripts: Arc<Scripts>,
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
    pub async fn connect(urls: &str, options: ConnectOptions<'_>, metrics: RedisMetrics) -> RedisResult<Redis> {
        let ConnectOptions { password, password_file, ca_pem, timeout, sharded, sentinel_username, sentinel_password } =
            options;
        // Read again when Redis refuses the password (a rotated Secret); a
        // cluster keeps the password of the start.
        let password_file = || {
            password_file.zip(password).map(|(path, password)| PasswordFile::new(path.to_owned(), password.to_owned()))
        };
        let scripts = Arc::new(Scripts::new());
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
            let primary = primary::Primary::start(
                primary::Locator::Sentinel(sentinels),
                password_file(),
                timeout,
                metrics.primary.clone(),
            )
            .await?;
            return Redis::single(primary, manager_config(), timeout, scripts, metrics, sharded.clone()).await;
        }
        let seeds = urls
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(|url| Ok(with_password(url.into_connection_info()?, password).set_tcp_settings(tcp_settings())))
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
            let primary = primary::Primary::start(locator, password_file(), timeout, metrics.primary.clone()).await?;
            return Redis::single(primary, manager_config(), timeout, scripts, metrics, sharded.clone()).await;
        }
        let mut conn = cluster_client(seeds.clone(), timeout, Some(timeout), ca_pem)?.get_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok(Redis {
            target: Target::Cluster { seeds, ca_pem: ca_pem.map(<[u8]>::to_vec) },
            conn: TimedConnection::new(Connection::Cluster(conn), metrics.commands, scripts.names()),
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
        scripts: Arc<Scripts>,
        metrics: RedisMetrics,
        sharded: std::collections::BTreeMap<String, u32>,
    ) -> RedisResult<Redis> {
        let mut conn = SharedConnection::connect(primary.clone(), config, timeout).await?;
        // Connecting does not prove the credentials: without a password Redis
        // accepts the connection and refuses every command (NOAUTH).
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok(Redis {
            target: Target::Single(primary),
            conn: TimedConnection::new(Connection::Managed(conn), metrics.commands, scripts.names()),
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

    /// Where commands go, for log lines (no credentials): the current
    /// primary's `host:port`, or a cluster's seed addresses.
    pub fn target(&self) -> String {
        match &self.target {
            Target::Single(primary) => primary.state().client.get_connection_info().addr().to_string(),
            Target::Cluster { seeds, .. } => {
                let seeds: Vec<String> = seeds.iter().map(|seed| seed.addr().to_string()).collect();
                format!("cluster {}", seeds.join(","))
            }
        }
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
    /// has gone silent), on a single server and on a cluster alike. The group readers take theirs from [`super::readers::ReaderPool`], which makes
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
                let conn = client.get_multiplexed_async_connection_with_config(&config).await.inspect_err(|e| {
                    if refuses_credentials(e) {
                        primary.credentials_refused();
                    }
                })?;
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
    /// The file `password` was read from, read again when Redis refuses it
    /// (single server and Sentinel; see [`super::credentials`]).
    pub password_file: Option<&'a std::path::Path>,
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
/// also set by the readers' own connections ([`super::resp`]).
pub(super) fn tcp_keepalive() -> redis::io::tcp::socket2::TcpKeepalive {
    redis::io::tcp::socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_IDLE)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES)
}

/// Whether the server has cluster mode on (`INFO cluster`).
async fn cluster_enabled(client: &Client, timeout: Duration) -> RedisResult<bool> {
    let config = AsyncConnectionConfig::new().set_connection_timeout(Some(timeout)).set_response_timeout(Some(timeout));
    let mut conn = client.get_multiplexed_async_connection_with_config(&config).await?;
    let info: String = redis::cmd("INFO").arg("cluster").query_async(&mut conn).await?;
    Ok(info.lines().any(|line| line.trim() == "cluster_enabled:1"))
}
