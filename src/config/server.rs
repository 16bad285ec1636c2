//! The gRPC server: where it listens, the limits every request is held to,
//! the threads that run it, whether it serves KEDA's external scaler, and how
//! long it waits for calls when it stops.

use std::{
    net::{SocketAddr, ToSocketAddrs},
    path::PathBuf,
    str::FromStr,
    time::Duration,
};

use clap::Args;

use super::millis;

/// Default gRPC listen address: loopback, because the sidecar serves its own pod.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
/// Default largest gRPC message, either way (bytes): 4 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// The largest `--max-message-bytes` (bytes): HTTP/2 frames a gRPC message
/// with a 4-byte length, and a bound makes a bad value's error name one.
pub const MAX_MESSAGE_BYTES_LIMIT: u64 = u32::MAX as u64;
/// Default most fields in one appended entry.
pub const DEFAULT_MAX_FIELDS_PER_ENTRY: usize = 1_000;
/// Default longest stream or group name (bytes).
pub const DEFAULT_MAX_NAME_BYTES: usize = 1_024;
/// Default time calls get on shutdown to settle what they hold.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The gRPC server and the process that runs it.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Server")]
pub struct ServerConfig {
    /// gRPC listen address: `host:port`, or `unix:/path` for a unix socket. The host is an IP address or
    /// a name, resolved once at start (its first IPv4 address, else its first IPv6 one).
    #[arg(long, env = "ECHOMQ_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: Listen,

    /// Largest gRPC message accepted or sent (bytes). A bigger request gets
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "ECHOMQ_MAX_MESSAGE_BYTES", default_value_t = DEFAULT_MAX_MESSAGE_BYTES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..=MAX_MESSAGE_BYTES_LIMIT))]
    pub max_message_bytes: usize,

    /// Most fields in one appended entry (INVALID_ARGUMENT above).
    #[arg(long, env = "ECHOMQ_MAX_FIELDS_PER_ENTRY", default_value_t = DEFAULT_MAX_FIELDS_PER_ENTRY, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=3_000))]
    pub max_fields_per_entry: usize,

    /// Longest stream or group name (bytes; INVALID_ARGUMENT above).
    #[arg(long, env = "ECHOMQ_MAX_NAME_BYTES", default_value_t = DEFAULT_MAX_NAME_BYTES, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_name_bytes: usize,

    /// Threads that run the sidecar's work (the async runtime's workers); 0: one per CPU the
    /// process may use. One costs the least CPU per entry (measured on 2 cores: 10 to 15% less than
    /// two, with the same throughput, as no work is handed between threads), but caps the sidecar
    /// at one CPU, and an archive fold (Parquet encoding) then holds deliveries back while it runs.
    #[arg(long, env = "ECHOMQ_WORKER_THREADS", default_value_t = 0, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=1024))]
    pub worker_threads: usize,

    /// Serve KEDA's external scaler protocol (`externalscaler.ExternalScaler`) on the gRPC port, behind
    /// the same token, mTLS and allow-list: a trigger's metric is a group's backlog (its lag plus the
    /// pending entries no live call holds), so KEDA scales consumers to the work and to zero.
    /// Off: the service is not served (UNIMPLEMENTED).
    #[arg(long, env = "ECHOMQ_KEDA_SCALER", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub keda_scaler: bool,

    /// Serve the KEDA scaler on this address (host:port) instead of the gRPC port, with nothing but
    /// health and reflection beside it; implies --keda-scaler. KEDA cannot send a bearer token, so
    /// this port asks for none; the stream allow-list applies, and mTLS with the --tls-* files. So
    /// a scaler the cluster can reach exposes no other EchoMQ call (the gRPC port can stay on
    /// loopback, or keep its token).
    #[arg(long, env = "ECHOMQ_KEDA_SCALER_LISTEN", value_name = "ADDR")]
    pub keda_scaler_listen: Option<std::net::SocketAddr>,

    /// Time (milliseconds) calls get on SIGTERM to settle what they hold before
    /// the sidecar ends them and exits. What is still un-settled stays pending.
    #[arg(id = "shutdown_grace_ms", long = "shutdown-grace-ms", value_name = "SHUTDOWN_GRACE_MS", env = "ECHOMQ_SHUTDOWN_GRACE_MS",
          default_value = default_millis!(DEFAULT_SHUTDOWN_GRACE), value_parser = millis::within(..))]
    pub shutdown_grace: Duration,
}

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
