//! Redis settings: where it is, how to log in to it and to its Sentinels,
//! how long a command may take, and the connections the groups' reads hold.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use clap::{Args, ValueEnum};

use super::millis;

/// Default Redis URL: a local Redis on its standard port.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// Default response timeout of a non-blocking Redis command.
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_secs(5);
/// Default most connections blocked in `XREADGROUP … BLOCK` (`--reader-connections`): one per
/// (stream, group) whose reader blocks (a sharded stream's shards one each).
pub const DEFAULT_READER_CONNECTIONS: usize = 64;
/// Default size of the shared readers' pool (`--shared-reader-connections`): each read takes one
/// for one non-blocking `XREADGROUP` and gives it back, so two serve any number of groups, and a
/// sidecar whose groups all share holds at most four connections to Redis (the shared one, the wake
/// connection and these two).
pub const DEFAULT_SHARED_READER_CONNECTIONS: usize = 2;
/// Most connections either reader pool may be given (`--reader-connections`,
/// `--shared-reader-connections`): Redis' default `maxclients`. A pool keeps a
/// slot for each connection it may hold, made at start, so an unbounded value
/// would fail the start on memory rather than on a message.
pub const MAX_READER_CONNECTIONS: u64 = 10_000;
/// With `--shared-readers auto`, a group read by more sidecars than this (by their heartbeats)
/// blocks: every new entry wakes each sidecar that shares a group's reads, so the work an entry
/// costs grows with them, while Redis hands an entry to one blocked reader for free.
pub const SHARED_MOST_SIDECARS: usize = 4;

/// How the groups' readers wait for new entries (`--shared-readers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SharedReaders {
    /// Per group, on a single server (or Sentinel) that accepts RESP3 and `CLIENT TRACKING`: shared
    /// while at most 4 sidecars read the group and it is quiet, blocking beyond (while a blocking
    /// connection is free; shared otherwise: nothing is refused), shared again at 2 sidecars or fewer
    /// once quiet. Blocking readers on a cluster, or when the server refuses RESP3 or tracking
    /// (logged once, as a warning).
    Auto,
    /// Shared, whatever the group; the sidecar refuses to start where it cannot be (a cluster, a
    /// server or ACL that refuses RESP3 or `CLIENT TRACKING`).
    On,
    /// Blocking readers: one connection per (stream, group) with calls, blocked in `XREADGROUP`.
    Off,
}

/// Where Redis is, and how the sidecar talks to it.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Redis")]
pub struct RedisConfig {
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
    pub sharded_streams: BTreeMap<String, u32>,

    /// Read the Redis password from this file (overrides one in the URL); pair
    /// it with an ACL user in the URL (`redis://user@host:port`). Read again
    /// whenever Redis refuses the password in use, so a rotated Secret is
    /// picked up on the next reconnect (single server and Sentinel; a cluster
    /// keeps the password read at start).
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

    /// Response timeout (milliseconds) of non-blocking Redis commands. A
    /// command with no reply in time retires its connection (the next one
    /// goes out on a new one), and readiness turns NOT_SERVING within 1 s
    /// plus this when Redis goes silent.
    #[arg(id = "redis_timeout_ms", long = "redis-timeout-ms", value_name = "REDIS_TIMEOUT_MS", env = "ECHOMQ_REDIS_TIMEOUT_MS",
          default_value = default_millis!(DEFAULT_REDIS_TIMEOUT), value_parser = millis::within(1..))]
    pub redis_timeout: Duration,

    /// Most Redis connections blocked in XREADGROUP BLOCK for the groups' reads of new entries: each
    /// is held by one (stream, group) whose reader blocks (a sharded stream: one per shard) while it
    /// has calls. With --shared-readers off (or on a cluster) every group's reader blocks, and a
    /// subscribe that finds none free within a second is refused RESOURCE_EXHAUSTED; with auto, only
    /// groups read by many sidecars block, and one that finds none free shares instead. 1 to 10,000.
    #[arg(id = "reader_connections", long = "reader-connections", value_name = "READER_CONNECTIONS", env = "ECHOMQ_READER_CONNECTIONS",
          default_value_t = DEFAULT_READER_CONNECTIONS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_READER_CONNECTIONS))]
    pub reader_connections: usize,

    /// Size of the shared readers' pool: every shared group's reads take turns on these, one
    /// non-blocking XREADGROUP at a time, so no subscribe is refused for want of one. 1 to 10,000.
    #[arg(id = "shared_reader_connections", long = "shared-reader-connections", value_name = "SHARED_READER_CONNECTIONS",
          env = "ECHOMQ_SHARED_READER_CONNECTIONS", default_value_t = DEFAULT_SHARED_READER_CONNECTIONS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_READER_CONNECTIONS))]
    pub shared_reader_connections: usize,

    /// How the groups' readers wait for new entries. Shared readers: one connection per sidecar,
    /// `echomq-wake`, tracks the streams read (CLIENT TRACKING), and a group reads with a short
    /// non-blocking XREADGROUP when Redis says its stream changed, on a small pool
    /// (--shared-reader-connections): a sidecar serving a thousand quiet groups holds four
    /// connections. But every new entry wakes each sidecar sharing the group's reads. Blocking
    /// readers: one connection per (stream, group), blocked in XREADGROUP BLOCK, to which Redis hands
    /// an entry directly. `auto` chooses per group: shared while at most 4 sidecars read it (their
    /// heartbeats say) and its reads find entries at most 10 times a second (over a second at
    /// least), blocking beyond (a busy group gets its entries sooner on a connection of its own);
    /// a blocking group shares again once at most 2 sidecars read it and its reads find entries
    /// under 2 times a second over a hygiene beat, so neither a fleet of 3 or 4 nor a pause flaps it.
    /// Blocking on a cluster or where the server refuses RESP3 (HELLO 3) or CLIENT TRACKING (logged as
    /// a warning). `on`: shared for every group, or refuse to start. `off`: blocking for every group.
    #[arg(long, env = "ECHOMQ_SHARED_READERS", value_enum, default_value_t = SharedReaders::Auto)]
    pub shared_readers: SharedReaders,
}

impl RedisConfig {
    /// Checks the URL and that Sentinel credentials come with a Sentinel URL.
    pub(super) fn validate(&self) -> Result<(), String> {
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
        Ok(())
    }
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
        ::redis::parse_redis_url(url)
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
