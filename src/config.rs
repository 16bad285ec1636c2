//! Configuration: command-line flags, each with an `ECHOMQ_*` environment
//! variable, defaults as named constants. Parsed in tests with
//! [`clap::Parser::try_parse_from`], never by setting process variables.

use std::{
    net::{SocketAddr, ToSocketAddrs},
    path::PathBuf,
    str::FromStr,
    time::Duration,
};

use clap::{Parser, ValueEnum};

/// Default Redis URL: a local Redis on its standard port.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// Default gRPC listen address: loopback, because the sidecar serves its own pod.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
/// Default admin HTTP address: all interfaces, because the kubelet probes the pod IP.
pub const DEFAULT_ADMIN_LISTEN: &str = "0.0.0.0:9464";
/// Default minimum PEL idle time (ms) before the reclaim beat takes an entry over.
pub const DEFAULT_RECLAIM_MIN_IDLE_MS: u64 = 30_000;
/// Default period (ms) of the reclaim beat (XAUTOCLAIM).
pub const DEFAULT_RECLAIM_INTERVAL_MS: u64 = 5_000;
/// Default `max_in_flight` (entries) for a subscription that sends 0.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 64;
/// Default upper bound (entries) on a subscription's `max_in_flight`.
pub const DEFAULT_MAX_IN_FLIGHT_LIMIT: u32 = 10_000;
/// Default `max_deliveries` of a group whose subscription sends 0: no limit.
pub const DEFAULT_MAX_DELIVERIES: u32 = 0;
/// Default idle time (ms) after which a consumer that holds nothing is removed.
pub const DEFAULT_CONSUMER_IDLE_LIMIT_MS: u64 = 3_600_000;
/// Default period (ms) of polling each group's state into metrics.
pub const DEFAULT_METRICS_POLL_INTERVAL_MS: u64 = 15_000;
/// Default first retry delay (ms) after a Fail without `retry_after`.
pub const DEFAULT_RETRY_BACKOFF_INITIAL_MS: u64 = 1_000;
/// Default cap (ms) of the retry delay.
pub const DEFAULT_RETRY_BACKOFF_MAX_MS: u64 = 60_000;
/// Default XREADGROUP BLOCK timeout (ms) of a group's reader.
pub const DEFAULT_READ_BLOCK_MS: u64 = 2_000;
/// Default time (ms) calls get on shutdown to settle what they hold.
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 10_000;
/// Default name of the entry field that carries the branded id.
pub const DEFAULT_ID_FIELD: &str = "id";
/// Default response timeout (ms) of a non-blocking Redis command.
pub const DEFAULT_REDIS_TIMEOUT_MS: u64 = 5_000;

/// Default period (ms) of the retention policies (`--retention`).
pub const DEFAULT_RETENTION_INTERVAL_MS: u64 = 10_000;
/// Default most entries in one archive file.
pub const DEFAULT_ARCHIVE_FILE_ENTRIES: u64 = 25_000;
/// Default least time (ms) between two files of fewer entries than that,
/// folded by retention, per stream: an hour.
pub const DEFAULT_ARCHIVE_PARTIAL_FILE_INTERVAL_MS: u64 = 3_600_000;

/// Default largest gRPC message, either way (bytes): 4 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Default most fields in one appended entry.
pub const DEFAULT_MAX_FIELDS_PER_ENTRY: usize = 1_000;
/// Default longest stream or group name (bytes).
pub const DEFAULT_MAX_NAME_BYTES: usize = 1_024;
/// Default most Consume calls open at once.
pub const DEFAULT_MAX_CONSUME_CALLS: usize = 1_024;
/// Default replicas an append waits for (`WAIT`): 0, none; appends are
/// answered once the primary has them, as Redis answers an `XADD`.
pub const DEFAULT_WAIT_REPLICAS: u32 = 0;
/// Default time (ms) an append waits for its replicas before it is answered
/// UNAVAILABLE as not confirmed.
pub const DEFAULT_WAIT_TIMEOUT_MS: u64 = 1_000;
/// Default dedup window (ms): two minutes, as NATS JetStream's duplicate
/// window. Long enough for a client to retry through a failover (Sentinel's
/// and a cluster's take seconds to tens of seconds) and a few backoffs; short
/// enough that the records (one Redis string of about 100 bytes plus the key
/// per keyed append) stay small: 1,000 keyed appends/s hold about 12 MB.
pub const DEFAULT_DEDUP_WINDOW_MS: u64 = 120_000;

/// Default most dedicated reader connections (one per (stream, group) with calls; a sharded stream's
/// shards one each).
pub const DEFAULT_READER_CONNECTIONS: usize = 64;

/// Where the gRPC API listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A TCP address, `host:port`.
    Tcp(SocketAddr),
    /// A unix socket path, written `unix:/path`.
    Unix(PathBuf),
}

impl FromStr for Listen {
    type Err = String;

    /// `unix:/path`, an IP address and a port, or a host name and a port. A
    /// host name is resolved here, once: the sidecar listens on its first IPv4
    /// address, else its first IPv6 one, so `localhost:50051` means
    /// `127.0.0.1:50051` (what the clients' default target expects) even where
    /// `localhost` also resolves to `::1`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Some(path) = text.strip_prefix("unix:") {
            return match path {
                "" => Err("a unix socket needs a path: `unix:/path/to/socket`".into()),
                path => Ok(Listen::Unix(PathBuf::from(path))),
            };
        }
        if let Ok(address) = text.parse() {
            return Ok(Listen::Tcp(address));
        }
        let Some((host, port)) = text.rsplit_once(':') else {
            return Err(format!("`{text}` is neither `host:port` nor `unix:/path`"));
        };
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(format!(
                "`{text}` is neither `host:port` (a host and a port from 0 to 65535) nor `unix:/path`"
            ));
        }
        let addresses: Vec<SocketAddr> = text
            .to_socket_addrs()
            .map_err(|e| format!("`{text}`: the host name `{host}` does not resolve ({e})"))?
            .collect();
        addresses
            .iter()
            .find(|a| a.is_ipv4())
            .or_else(|| addresses.first())
            .copied()
            .map(Listen::Tcp)
            .ok_or_else(|| format!("`{text}`: the host name `{host}` resolves to no address"))
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(addr) => write!(f, "{addr}"),
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// How log lines are written to standard error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The sidecar's settings. Every flag has an `ECHOMQ_*` environment variable;
/// a flag given on the command line wins over the variable.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "echomq-sidecar",
    version,
    about = "Owns Redis Streams consumer groups and hands deliveries to services in any language over gRPC.",
    after_help = "Log verbosity follows ECHOMQ_LOG (tracing filter syntax, e.g. `info,echomq=debug`; default `info`).\nTraces are exported over OTLP gRPC when OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set; the other standard OTEL_* variables apply."
)]
pub struct Config {
    /// Redis URL: `redis://[user:password@]host:port[/db]`, or `rediss://` for TLS. For a Redis Cluster,
    /// one node's URL or a comma-separated seed list (`redis://10.0.0.1:6379,redis://10.0.0.2:6379`):
    /// cluster mode is detected from the server (INFO cluster). For Redis Sentinel,
    /// `redis+sentinel://[user:password@]host:port[,host:port…]/MASTER[/DB]` (`rediss+sentinel://`: TLS to
    /// the data nodes): the userinfo is the data nodes'; the Sentinels' own credentials are
    /// --sentinel-username / --sentinel-password. On a single server or Sentinel the sidecar follows the
    /// primary through failovers (docs: High availability).
    // Checked in `validate`, not by clap: clap's refusal repeats the value, password and all.
    #[arg(long, env = "ECHOMQ_REDIS_URL", default_value = DEFAULT_REDIS_URL)]
    pub redis_url: String,

    /// Sharded streams: `name=shards[,name=shards…]`, e.g. `orders=4`. A sharded stream is that many stream
    /// keys, `<name>:{<name>:<k>}`; Append spreads entries over them (by partition key), Consume and
    /// DescribeGroup on `<name>` cover them all. Every sidecar that appends to or consumes a sharded stream
    /// must name it with the same count.
    #[arg(long, env = "ECHOMQ_SHARDED_STREAMS", default_value = "", value_parser = crate::keys::parse_sharded)]
    pub sharded_streams: std::collections::BTreeMap<String, u32>,

    /// gRPC listen address: `host:port`, or `unix:/path` for a unix socket. The host is an IP address or
    /// a name, resolved once at start (its first IPv4 address, else its first IPv6 one).
    #[arg(long, env = "ECHOMQ_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: Listen,

    /// Admin HTTP address (`host:port`) serving /livez, /readyz and /metrics.
    #[arg(long, env = "ECHOMQ_ADMIN_LISTEN", default_value = DEFAULT_ADMIN_LISTEN)]
    pub admin_listen: SocketAddr,

    /// This sidecar's consumer name in every group; keep it stable across
    /// restarts of the same pod so a restart recovers its own pending entries.
    /// Default: $POD_NAME, else the host name.
    #[arg(long, env = "ECHOMQ_CONSUMER_NAME", value_parser = parse_consumer_name)]
    pub consumer_name: Option<String>,

    /// Minimum PEL idle time (milliseconds) after which the reclaim beat
    /// (XAUTOCLAIM) takes over an entry another consumer left. Held entries are
    /// kept fresh every third of it.
    #[arg(long, env = "ECHOMQ_RECLAIM_MIN_IDLE_MS", default_value_t = DEFAULT_RECLAIM_MIN_IDLE_MS, value_parser = clap::value_parser!(u64).range(100..))]
    pub reclaim_min_idle_ms: u64,

    /// Period of the reclaim beat (milliseconds).
    #[arg(long, env = "ECHOMQ_RECLAIM_INTERVAL_MS", default_value_t = DEFAULT_RECLAIM_INTERVAL_MS, value_parser = clap::value_parser!(u64).range(10..))]
    pub reclaim_interval_ms: u64,

    /// `max_in_flight` (entries) of a subscription that sends 0.
    #[arg(long, env = "ECHOMQ_DEFAULT_MAX_IN_FLIGHT", default_value_t = DEFAULT_MAX_IN_FLIGHT, value_parser = clap::value_parser!(u32).range(1..))]
    pub default_max_in_flight: u32,

    /// The largest `max_in_flight` (entries) a subscription may ask for.
    #[arg(long, env = "ECHOMQ_MAX_IN_FLIGHT_LIMIT", default_value_t = DEFAULT_MAX_IN_FLIGHT_LIMIT, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_in_flight_limit: u32,

    /// Idle time (milliseconds) after which another consumer of a group that
    /// holds no pending entries, and whose sidecar has not recorded a
    /// heartbeat within it, is removed (XGROUP DELCONSUMER). A consumer with
    /// pending entries is never removed, nor a live sidecar on a quiet stream:
    /// every sidecar beats every quarter of this limit (at most every 10 s)
    /// into `<stream>:heartbeats:<group>`. Give all sidecars of a group the
    /// same limit. 0: never remove; else at least 1000 (shorter, a heartbeat
    /// could not keep up and live sidecars would remove each other).
    #[arg(long, env = "ECHOMQ_CONSUMER_IDLE_LIMIT_MS", default_value_t = DEFAULT_CONSUMER_IDLE_LIMIT_MS, value_parser = off_or_at_least::<1_000>)]
    pub consumer_idle_limit_ms: u64,

    /// Deliveries after which an entry is dead-lettered, for subscriptions
    /// that send `max_deliveries` 0; 0: no limit.
    #[arg(long, env = "ECHOMQ_DEFAULT_MAX_DELIVERIES", default_value_t = DEFAULT_MAX_DELIVERIES)]
    pub default_max_deliveries: u32,

    /// First retry delay (milliseconds) after a Fail without `retry_after` or a
    /// dropped call; doubled per attempt, with jitter, up to the maximum.
    #[arg(long, env = "ECHOMQ_RETRY_BACKOFF_INITIAL_MS", default_value_t = DEFAULT_RETRY_BACKOFF_INITIAL_MS)]
    pub retry_backoff_initial_ms: u64,

    /// Cap of the retry delay (milliseconds).
    #[arg(long, env = "ECHOMQ_RETRY_BACKOFF_MAX_MS", default_value_t = DEFAULT_RETRY_BACKOFF_MAX_MS)]
    pub retry_backoff_max_ms: u64,

    /// XREADGROUP BLOCK timeout (milliseconds) of a group's reader. A read
    /// with no reply within this plus --redis-timeout-ms (a black-holed or
    /// stalled Redis) is given up and retried on a new connection.
    #[arg(long, env = "ECHOMQ_READ_BLOCK_MS", default_value_t = DEFAULT_READ_BLOCK_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub read_block_ms: u64,

    /// Time (milliseconds) calls get on SIGTERM to settle what they hold before
    /// the sidecar ends them and exits. What is still un-settled stays pending.
    #[arg(long, env = "ECHOMQ_SHUTDOWN_GRACE_MS", default_value_t = DEFAULT_SHUTDOWN_GRACE_MS)]
    pub shutdown_grace_ms: u64,

    /// Name of the entry field that carries the branded id. Not in the
    /// `echomq.` namespace, which dead letters use for their metadata (and a
    /// replay strips).
    #[arg(long, env = "ECHOMQ_ID_FIELD", default_value = DEFAULT_ID_FIELD, value_parser = parse_id_field)]
    pub id_field: String,

    /// Where what a trim removes is archived first: `file:///absolute/dir`, or `s3://bucket[/prefix]` for
    /// any S3-compatible store (endpoint, region and credentials from the standard `AWS_*` variables, e.g.
    /// `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`). With an archive,
    /// Trim and `--retention` fold entries into Parquet files before XTRIM removes them, Read returns them
    /// from there, and an Append's `max_len` is refused. A URL that cannot be parsed, or a store that
    /// does not accept a write at start, exits 2. Unset: no archive (a trim forgets).
    #[arg(long, env = "ECHOMQ_ARCHIVE_URL", value_parser = parse_non_empty)]
    pub archive_url: Option<String>,

    /// Retention policies, `NAME=maxlen:N` (keep the newest N entries) or `NAME=maxage:DURATION` (keep
    /// what was appended within DURATION: `500ms`, `90s`, `30m`, `12h`, `7d`), repeatable or
    /// comma-separated. NAME is a stream key, a dead-letter stream or a sharded stream (each shard
    /// then keeps its own N). Applied every `--retention-interval-ms` as a safe Trim (never past what a
    /// group still needs; archived first with `--archive-url`), by one sidecar at a time per stream.
    #[arg(long, env = "ECHOMQ_RETENTION", value_delimiter = ',', value_parser = parse_retention)]
    pub retention: Vec<Retention>,

    /// Period of the retention policies (milliseconds).
    #[arg(long, env = "ECHOMQ_RETENTION_INTERVAL_MS", default_value_t = DEFAULT_RETENTION_INTERVAL_MS, value_parser = clap::value_parser!(u64).range(10..))]
    pub retention_interval_ms: u64,

    /// The most entries folded into one archive file (entries): also the most a fold holds in memory at
    /// once (about 25,000 × the entry size).
    #[arg(long, env = "ECHOMQ_ARCHIVE_FILE_ENTRIES", default_value_t = DEFAULT_ARCHIVE_FILE_ENTRIES, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub archive_file_entries: u64,

    /// Least time (milliseconds) between two partial archive files (fewer entries than
    /// --archive-file-entries) that retention folds of one stream. Between them retention folds whole
    /// files only and leaves the rest in the stream (at most one file's worth more than the policy
    /// keeps), so a steady stream does not become thousands of tiny files. 0: a partial file every
    /// round. A Trim call always folds everything it removes.
    #[arg(long, env = "ECHOMQ_ARCHIVE_PARTIAL_FILE_INTERVAL_MS", default_value_t = DEFAULT_ARCHIVE_PARTIAL_FILE_INTERVAL_MS)]
    pub archive_partial_file_interval_ms: u64,

    /// Response timeout (milliseconds) of non-blocking Redis commands. A
    /// command with no reply in time retires its connection (the next one
    /// goes out on a new one), and readiness turns NOT_SERVING within 1 s
    /// plus this when Redis goes silent.
    #[arg(long, env = "ECHOMQ_REDIS_TIMEOUT_MS", default_value_t = DEFAULT_REDIS_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub redis_timeout_ms: u64,

    /// How often (milliseconds) each subscribed group's state (pending, lag,
    /// oldest pending age, …) is polled into the `/metrics` gauges. 0: never;
    /// else at least 100.
    #[arg(long, env = "ECHOMQ_METRICS_POLL_INTERVAL_MS", default_value_t = DEFAULT_METRICS_POLL_INTERVAL_MS, value_parser = off_or_at_least::<100>)]
    pub metrics_poll_interval_ms: u64,

    /// Serve gRPC over TLS with this PEM certificate chain (with --tls-key-file).
    #[arg(long, env = "ECHOMQ_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// The PEM private key of --tls-cert-file.
    #[arg(long, env = "ECHOMQ_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,

    /// Require client certificates signed by this PEM CA (mTLS). A client's
    /// identity, for --allow-streams-for, is its certificate's first URI SAN,
    /// else its first DNS SAN.
    #[arg(long, env = "ECHOMQ_TLS_CLIENT_CA_FILE", requires = "tls_cert_file")]
    pub tls_client_ca_file: Option<PathBuf>,

    /// Require `authorization: Bearer <token>` on the EchoMQ services, the
    /// token read from this file (surrounding whitespace ignored). Health and
    /// reflection stay open.
    #[arg(long, env = "ECHOMQ_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,

    /// Stream patterns every caller may use, comma-separated; `*` matches any
    /// run of characters (e.g. `orders:*,payments`). Unset, with no
    /// --allow-streams-for: every stream.
    #[arg(long, env = "ECHOMQ_ALLOW_STREAMS", value_delimiter = ',', value_parser = parse_pattern)]
    pub allow_streams: Vec<String>,

    /// Stream patterns one mTLS identity may use besides --allow-streams:
    /// `IDENTITY=PATTERN,PATTERN`. Repeat the flag for more identities; in the
    /// variable, separate rules with `;`.
    #[arg(long, env = "ECHOMQ_ALLOW_STREAMS_FOR", value_delimiter = ';', value_parser = parse_allow_rule)]
    pub allow_streams_for: Vec<(String, Vec<String>)>,

    /// Read the Redis password from this file (overrides one in the URL); pair
    /// it with an ACL user in the URL (`redis://user@host:port`).
    #[arg(long, env = "ECHOMQ_REDIS_PASSWORD_FILE")]
    pub redis_password_file: Option<PathBuf>,

    /// The Sentinels' own ACL user, for a `redis+sentinel://` URL (the URL's userinfo is the data nodes').
    #[arg(long, env = "ECHOMQ_SENTINEL_USERNAME")]
    pub sentinel_username: Option<String>,

    /// The Sentinels' own password, for a `redis+sentinel://` URL. Prefer --sentinel-password-file or a
    /// Secret in the variable: a flag's value shows in the process list.
    #[arg(long, env = "ECHOMQ_SENTINEL_PASSWORD", hide_env_values = true, conflicts_with = "sentinel_password_file")]
    pub sentinel_password: Option<String>,

    /// Read the Sentinels' own password from this file (a mounted Secret).
    #[arg(long, env = "ECHOMQ_SENTINEL_PASSWORD_FILE")]
    pub sentinel_password_file: Option<PathBuf>,

    /// Trust this PEM CA for `rediss://` instead of the system's roots.
    #[arg(long, env = "ECHOMQ_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,

    /// Largest gRPC message accepted or sent (bytes). A bigger request gets
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "ECHOMQ_MAX_MESSAGE_BYTES", default_value_t = DEFAULT_MAX_MESSAGE_BYTES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..))]
    pub max_message_bytes: usize,

    /// Most fields in one appended entry (INVALID_ARGUMENT above).
    #[arg(long, env = "ECHOMQ_MAX_FIELDS_PER_ENTRY", default_value_t = DEFAULT_MAX_FIELDS_PER_ENTRY, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=3_000))]
    pub max_fields_per_entry: usize,

    /// Longest stream or group name (bytes; INVALID_ARGUMENT above).
    #[arg(long, env = "ECHOMQ_MAX_NAME_BYTES", default_value_t = DEFAULT_MAX_NAME_BYTES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_name_bytes: usize,

    /// Most Consume calls open at once (RESOURCE_EXHAUSTED above).
    #[arg(long, env = "ECHOMQ_MAX_CONSUME_CALLS", default_value_t = DEFAULT_MAX_CONSUME_CALLS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_consume_calls: usize,

    /// Most dedicated Redis connections for the groups' blocking reads (XREADGROUP BLOCK), each
    /// held by one (stream, group) while it has calls (a sharded stream: one per shard). A subscribe
    /// that finds none free within a second is refused RESOURCE_EXHAUSTED.
    #[arg(long, env = "ECHOMQ_READER_CONNECTIONS", default_value_t = DEFAULT_READER_CONNECTIONS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub reader_connections: usize,

    /// Threads that run the sidecar's work (the async runtime's workers); 0: one per CPU the
    /// process may use. One costs the least CPU per entry (measured on 2 cores: 10 to 15% less than
    /// two, with the same throughput, as no work is handed between threads), but caps the sidecar
    /// at one CPU, and an archive fold (Parquet encoding) then holds deliveries back while it runs.
    #[arg(long, env = "ECHOMQ_WORKER_THREADS", default_value_t = 0, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=1024))]
    pub worker_threads: usize,

    /// Replicas that must have an appended entry before Append, AppendBatch or ReplayDeadLetters answers:
    /// each write is followed by `WAIT N --wait-timeout-ms` on a connection of its own (one WAIT covers
    /// every write queued meanwhile). A write not confirmed in time is answered UNAVAILABLE, naming its
    /// ids: it is on the primary but may be lost if the primary fails now. 0: no waiting (the default).
    /// More than the primary has connected is allowed (a warning at start): every append then times out.
    #[arg(long, env = "ECHOMQ_WAIT_REPLICAS", default_value_t = DEFAULT_WAIT_REPLICAS, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub wait_replicas: u32,

    /// How long (milliseconds) a write waits for --wait-replicas (or --wait-aof) before it is answered
    /// UNAVAILABLE as not confirmed.
    #[arg(long, env = "ECHOMQ_WAIT_TIMEOUT_MS", default_value_t = DEFAULT_WAIT_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub wait_timeout_ms: u64,

    /// Confirm writes with `WAITAOF 1 N` instead of `WAIT N`: fsynced to the primary's append-only file
    /// and to N (--wait-replicas) replicas' files. Needs Redis 7.2 or newer, or Valkey, with
    /// `appendonly yes`: the sidecar refuses to start (exit 2) on an older server.
    #[arg(long, env = "ECHOMQ_WAIT_AOF", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub wait_aof: bool,

    /// How long (milliseconds) an append's dedup_key is remembered, from its first append: a second
    /// append with the same key on the same stream within it writes nothing and answers the first's ids.
    /// Each keyed append keeps one Redis key that long (about 100 bytes plus the key).
    #[arg(long, env = "ECHOMQ_DEDUP_WINDOW_MS", default_value_t = DEFAULT_DEDUP_WINDOW_MS, value_parser = clap::value_parser!(u64).range(1_000..=604_800_000))]
    pub dedup_window_ms: u64,

    /// Log line format on standard error.
    #[arg(long, env = "ECHOMQ_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl Config {
    /// The consumer name: the flag or variable, else `$POD_NAME`, else the host
    /// name, else `echomq-sidecar`. `pod_name` and `host_name` are passed in so
    /// tests need not touch the process environment.
    pub fn consumer_name_or(&self, pod_name: Option<String>, host_name: Option<String>) -> String {
        [self.consumer_name.clone(), pod_name, host_name]
            .into_iter()
            .flatten()
            .map(|name| name.trim().to_owned())
            .find(|name| !name.is_empty())
            .unwrap_or_else(|| "echomq-sidecar".to_owned())
    }

    /// The consumer name from this process's environment (`$POD_NAME`, then
    /// `/proc/sys/kernel/hostname`).
    pub fn consumer_name(&self) -> String {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").ok().or_else(|| std::env::var("HOSTNAME").ok());
        self.consumer_name_or(std::env::var("POD_NAME").ok(), host)
    }

    /// The reclaim beat's minimum idle time.
    pub fn reclaim_min_idle(&self) -> Duration {
        Duration::from_millis(self.reclaim_min_idle_ms)
    }

    /// How often held entries' idle time is refreshed: a third of the reclaim
    /// minimum idle time, so two refreshes can fail before a peer may reclaim.
    pub fn lease_refresh_interval(&self) -> Duration {
        Duration::from_millis((self.reclaim_min_idle_ms / 3).max(10))
    }

    /// Checks relations between settings that one flag's parser cannot see.
    pub fn validate(&self) -> Result<(), String> {
        check_redis_url(&self.redis_url).map_err(|reason| format!("--redis-url (ECHOMQ_REDIS_URL): {reason}"))?;
        let sentinel_settings = [
            ("--sentinel-username (ECHOMQ_SENTINEL_USERNAME)", self.sentinel_username.is_some()),
            ("--sentinel-password (ECHOMQ_SENTINEL_PASSWORD)", self.sentinel_password.is_some()),
            ("--sentinel-password-file (ECHOMQ_SENTINEL_PASSWORD_FILE)", self.sentinel_password_file.is_some()),
        ];
        if let Some((flag, _)) = sentinel_settings.iter().find(|(_, set)| *set) {
            if !crate::redis::primary::SentinelUrl::is_sentinel(self.redis_url.trim()) {
                return Err(format!(
                    "{flag} is the Sentinels' own credential, but --redis-url is not a redis+sentinel:// URL: \
                     drop it, or name the Sentinels (redis+sentinel://host:port[,host:port…]/MASTER)"
                ));
            }
        }
        if self.default_max_in_flight > self.max_in_flight_limit {
            return Err(format!(
                "--default-max-in-flight ({}) is above --max-in-flight-limit ({})",
                self.default_max_in_flight, self.max_in_flight_limit
            ));
        }
        if !self.allow_streams_for.is_empty() && self.tls_client_ca_file.is_none() {
            return Err("--allow-streams-for grants streams to mTLS identities, so it needs --tls-client-ca-file \
                        (without client certificates no caller has an identity)"
                .to_owned());
        }
        let repeated = self
            .retention
            .iter()
            .enumerate()
            .find(|(k, policy)| self.retention[..*k].iter().any(|earlier| earlier.stream == policy.stream));
        if let Some((_, policy)) = repeated {
            return Err(format!("--retention names stream `{}` twice: give each stream one policy", policy.stream));
        }
        if self.retry_backoff_initial_ms > self.retry_backoff_max_ms {
            return Err(format!(
                "--retry-backoff-initial-ms ({}) is above --retry-backoff-max-ms ({})",
                self.retry_backoff_initial_ms, self.retry_backoff_max_ms
            ));
        }
        Ok(())
    }
}

/// Milliseconds that are 0 (off) or at least `MIN`: below it, a heartbeat
/// cannot keep up with the idle limit (live sidecars would remove each
/// other), or polling would keep Redis busy for no reader.
fn off_or_at_least<const MIN: u64>(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(ms) if ms == 0 || ms >= MIN => Ok(ms),
        Ok(ms) => Err(format!("{ms} ms is too short: give 0 (off) or at least {MIN} ms")),
        Err(_) => Err(format!("`{text}` is not a number of milliseconds")),
    }
}

/// One retention policy (`--retention`): which stream, and what it keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retention {
    /// A stream key, or a sharded stream's name.
    pub stream: String,
    /// What the stream keeps.
    pub keep: Keep,
}

/// What a retention policy keeps of a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// The newest N entries (`maxlen:N`).
    Newest(u64),
    /// The entries appended within this long (`maxage:DURATION`), by their stream ids' milliseconds.
    Within(Duration),
}

fn parse_retention(text: &str) -> Result<Retention, String> {
    let shape = "give `NAME=maxlen:N` or `NAME=maxage:DURATION` (e.g. `orders=maxlen:100000`, `orders=maxage:7d`)";
    let (stream, policy) = text.rsplit_once('=').ok_or_else(|| shape.to_owned())?;
    if stream.is_empty() {
        return Err(format!("no stream name: {shape}"));
    }
    let keep = match policy.split_once(':') {
        Some(("maxlen", n)) => match n.parse::<u64>() {
            Ok(n) if n > 0 => Keep::Newest(n),
            _ => return Err(format!("maxlen takes a number of entries above 0, not `{n}`")),
        },
        Some(("maxage", age)) => match parse_duration(age) {
            Some(age) if !age.is_zero() => Keep::Within(age),
            _ => {
                return Err(format!(
                    "`{age}` is not a duration above 0: give a number and ms, s, m, h or d (e.g. `7d`)"
                ))
            }
        },
        _ => return Err(format!("`{policy}` is not a policy: {shape}")),
    };
    Ok(Retention { stream: stream.to_owned(), keep })
}

/// `500ms`, `90s`, `30m`, `12h`, `7d`: a whole number and a unit (`ms`,
/// `s`, `m`, `h`, `d`); `None` for anything else or an overflow. The
/// retention policies and echomqctl's durations both read this form.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    Some(Duration::from_millis(number.parse::<u64>().ok()?.checked_mul(ms)?))
}

fn parse_allow_rule(text: &str) -> Result<(String, Vec<String>), String> {
    let (identity, patterns) =
        text.split_once('=').ok_or_else(|| format!("`{text}` is not IDENTITY=PATTERN,PATTERN"))?;
    let patterns: Vec<String> =
        patterns.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned).collect();
    if identity.trim().is_empty() || patterns.is_empty() {
        return Err(format!("`{text}` needs an identity and at least one pattern: IDENTITY=PATTERN,PATTERN"));
    }
    Ok((identity.trim().to_owned(), patterns))
}

/// One Redis URL, a comma-separated seed list of cluster nodes, or a
/// Sentinel URL. Errors: the reason, naming the URL with its passwords
/// replaced by `***` (see [`crate::redis::primary::redacted_url`]).
fn check_redis_url(text: &str) -> Result<(), String> {
    use crate::redis::primary::{redacted_url, SentinelUrl};
    if SentinelUrl::is_sentinel(text.trim()) {
        return SentinelUrl::parse(text.trim())
            .map(drop)
            .map_err(|reason| format!("`{}`: {reason}", redacted_url(text)));
    }
    let urls: Vec<&str> = text.split(',').map(str::trim).filter(|url| !url.is_empty()).collect();
    if urls.is_empty() {
        return Err("expected a Redis URL (redis://host:port), or a comma-separated list of cluster nodes".to_owned());
    }
    for url in &urls {
        redis::parse_redis_url(url)
            .filter(|parsed| matches!(parsed.scheme(), "redis" | "rediss" | "unix" | "redis+unix"))
            .filter(|parsed| urls.len() == 1 || matches!(parsed.scheme(), "redis" | "rediss"))
            .ok_or_else(|| {
                format!(
                    "`{}` is not a Redis URL: expected redis://host:port, rediss://host:port, unix:///path or \
                     redis+sentinel://host:port[,host:port…]/MASTER (a cluster seed list takes redis:// or rediss:// \
                     URLs, comma-separated)",
                    redacted_url(url)
                )
            })?;
    }
    Ok(())
}

/// One allow-list pattern, trimmed; an empty one would match no stream.
fn parse_pattern(text: &str) -> Result<String, String> {
    match text.trim() {
        "" => Err("an empty stream pattern matches no stream; list patterns like `orders:*,payments`".to_owned()),
        pattern => Ok(pattern.to_owned()),
    }
}

fn parse_consumer_name(text: &str) -> Result<String, String> {
    let name = parse_non_empty(text)?;
    if name.len() > 256 {
        return Err("a consumer name is at most 256 bytes".into());
    }
    Ok(name)
}

fn parse_non_empty(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("must not be empty".into());
    }
    Ok(text.to_owned())
}

fn parse_id_field(text: &str) -> Result<String, String> {
    let field = parse_non_empty(text)?;
    if field.starts_with("echomq.") {
        return Err("the `echomq.` prefix is reserved for dead-letter metadata (which a replay strips); \
                    pick another name"
            .into());
    }
    Ok(field)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from(std::iter::once("echomq-sidecar").chain(args.iter().copied()))
    }

    #[test]
    fn idle_limit_and_poll_interval_are_off_or_long_enough() {
        let config = parse(&["--consumer-idle-limit-ms", "0", "--metrics-poll-interval-ms", "0"]).unwrap();
        assert_eq!((config.consumer_idle_limit_ms, config.metrics_poll_interval_ms), (0, 0));
        let config = parse(&["--consumer-idle-limit-ms", "1000", "--metrics-poll-interval-ms", "100"]).unwrap();
        assert_eq!((config.consumer_idle_limit_ms, config.metrics_poll_interval_ms), (1_000, 100));
        for (flag, value) in [("--consumer-idle-limit-ms", "1"), ("--metrics-poll-interval-ms", "99")] {
            let error = parse(&[flag, value]).unwrap_err().to_string();
            assert!(error.contains("too short"), "{flag} {value}: {error}");
        }
    }

    #[test]
    fn retention_policies_parse_and_bad_ones_say_what_to_give() {
        let config = parse(&["--retention", "a=maxlen:5,{b}:dlq=maxage:7d", "--retention", "c=maxage:250ms"]).unwrap();
        assert_eq!(
            config.retention,
            [
                Retention { stream: "a".into(), keep: Keep::Newest(5) },
                Retention { stream: "{b}:dlq".into(), keep: Keep::Within(Duration::from_secs(7 * 86_400)) },
                Retention { stream: "c".into(), keep: Keep::Within(Duration::from_millis(250)) },
            ]
        );
        for bad in
            ["a", "=maxlen:1", "a=maxlen:0", "a=maxlen:x", "a=maxage:7", "a=maxage:0s", "a=keep:1", "a=maxage:1w"]
        {
            let error = parse(&["--retention", bad]).unwrap_err().to_string();
            assert!(error.contains("maxlen") || error.contains("duration"), "{bad}: {error}");
        }
    }

    #[test]
    fn no_flags_means_local_defaults() {
        let config = parse(&[]).unwrap();
        assert_eq!(config.redis_url, DEFAULT_REDIS_URL);
        assert_eq!(config.listen, Listen::Tcp("127.0.0.1:50051".parse().unwrap()));
        assert_eq!(config.admin_listen, "0.0.0.0:9464".parse().unwrap());
        assert_eq!(config.default_max_in_flight, DEFAULT_MAX_IN_FLIGHT);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn listen_takes_a_unix_socket() {
        let config = parse(&["--listen", "unix:/run/echomq.sock"]).unwrap();
        assert_eq!(config.listen, Listen::Unix("/run/echomq.sock".into()));
    }

    #[test]
    fn listen_takes_a_host_name_that_resolves() {
        // `localhost` resolves from /etc/hosts, with no DNS server involved.
        let Listen::Tcp(address) = parse(&["--listen", "localhost:50051"]).unwrap().listen else {
            panic!("localhost:50051 is a TCP address");
        };
        assert!(address.ip().is_loopback(), "{address}");
        assert_eq!(address.port(), 50051);
        assert_eq!(parse(&["--listen", "[::1]:7"]).unwrap().listen, Listen::Tcp("[::1]:7".parse().unwrap()));
    }

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        for args in [
            &["--listen", "nonsense"][..],
            &["--listen", "localhost"],
            &["--listen", ":50051"],
            &["--listen", "localhost:99999"],
            &["--listen", "unix:"],
            &["--consumer-name", " "],
            &["--reclaim-min-idle-ms", "0"],
            &["--default-max-in-flight", "0"],
            &["--id-field", "echomq.id"],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
        for url in ["http://x", "redis://u:s3cret@h:99999", "redis+sentinel://u:s3cret@h:1", ""] {
            let refused = parse(&["--redis-url", url]).unwrap().validate().unwrap_err();
            assert!(refused.starts_with("--redis-url (ECHOMQ_REDIS_URL): "), "{refused}");
            assert!(!refused.contains("s3cret"), "the password is shown: {refused}");
        }
        let stray = parse(&["--sentinel-password", "p"]).unwrap().validate().unwrap_err();
        assert!(stray.contains("not a redis+sentinel:// URL") && !stray.contains("\"p\""), "{stray}");
        let sentinel = ["--redis-url", "redis+sentinel://s:26379/m", "--sentinel-username", "u"];
        assert!(parse(&sentinel).unwrap().validate().is_ok());
        let config = parse(&["--default-max-in-flight", "20", "--max-in-flight-limit", "10"]).unwrap();
        assert!(config.validate().unwrap_err().contains("--max-in-flight-limit"));
        let twice = parse(&["--retention", "x=maxlen:3,y=maxlen:1,x=maxage:1d"]).unwrap();
        assert!(twice.validate().unwrap_err().contains("`x` twice"));
        assert!(parse(&["--retention", "x=maxlen:3,y=maxlen:1"]).unwrap().validate().is_ok());
    }

    #[test]
    fn allow_lists_parse() {
        let config = parse(&["--allow-streams", "a:*,b", "--allow-streams-for", "svc=c:*,d"]).unwrap();
        assert_eq!(config.allow_streams, vec!["a:*", "b"]);
        assert_eq!(config.allow_streams_for, vec![("svc".to_owned(), vec!["c:*".to_owned(), "d".to_owned()])]);
        assert!(parse(&["--allow-streams-for", "svc="]).is_err());
        assert_eq!(parse(&["--allow-streams", " a , b"]).unwrap().allow_streams, vec!["a", "b"]);
        assert!(parse(&["--allow-streams", ""]).is_err(), "an empty list would deny every stream");
        let per_identity = parse(&["--allow-streams-for", "svc=c:*"]).unwrap();
        assert!(per_identity.validate().is_err(), "identities need mTLS");
        assert!(parse(&["--tls-cert-file", "c.pem"]).is_err(), "a certificate needs its key");
    }

    #[test]
    fn consumer_name_falls_back_to_pod_then_host() {
        let config = parse(&[]).unwrap();
        assert_eq!(config.consumer_name_or(Some("pod-1".into()), Some("host\n".into())), "pod-1");
        assert_eq!(config.consumer_name_or(None, Some("host\n".into())), "host");
        assert_eq!(config.consumer_name_or(None, None), "echomq-sidecar");
        let config = parse(&["--consumer-name", "me"]).unwrap();
        assert_eq!(config.consumer_name_or(Some("pod-1".into()), None), "me");
    }

    #[test]
    fn reader_connections_default_and_bounds() {
        assert_eq!(parse(&[]).unwrap().reader_connections, DEFAULT_READER_CONNECTIONS);
        assert_eq!(parse(&["--reader-connections", "2"]).unwrap().reader_connections, 2);
        assert!(parse(&["--reader-connections", "0"]).is_err(), "no reader could ever read");
    }

    #[test]
    fn durable_append_settings_default_off_and_are_bounded() {
        let config = parse(&[]).unwrap();
        assert_eq!((config.wait_replicas, config.wait_timeout_ms, config.wait_aof), (0, 1_000, false));
        assert_eq!(config.dedup_window_ms, DEFAULT_DEDUP_WINDOW_MS);
        let config =
            parse(&["--wait-replicas", "2", "--wait-timeout-ms", "250", "--wait-aof", "--dedup-window-ms", "1000"])
                .unwrap();
        assert_eq!((config.wait_replicas, config.wait_timeout_ms, config.wait_aof), (2, 250, true));
        assert_eq!(config.dedup_window_ms, 1_000);
        assert!(parse(&["--wait-aof", "false"]).is_ok_and(|c| !c.wait_aof));
        for bad in [
            &["--wait-timeout-ms", "0"][..],
            &["--wait-replicas", "-1"],
            &["--wait-replicas", "101"],
            &["--dedup-window-ms", "999"],
            &["--wait-aof", "maybe"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn worker_threads_default_to_one_per_cpu() {
        assert_eq!(parse(&[]).unwrap().worker_threads, 0);
        assert_eq!(parse(&["--worker-threads", "1"]).unwrap().worker_threads, 1);
        assert!(parse(&["--worker-threads", "-1"]).is_err());
        assert!(parse(&["--worker-threads", "1025"]).is_err());
    }
}
