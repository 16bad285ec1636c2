//! What the sidecar tells about itself: the admin HTTP port (probes and
//! metrics), how often group state is polled into metrics, and its logs.

use std::{net::SocketAddr, time::Duration};

use clap::{Args, ValueEnum};

use super::millis;

/// Default admin HTTP address: all interfaces, because the kubelet probes the pod IP.
pub const DEFAULT_ADMIN_LISTEN: &str = "0.0.0.0:9464";
/// Default period of polling each group's state into metrics.
pub const DEFAULT_METRICS_POLL_INTERVAL: Duration = Duration::from_secs(15);

/// The admin port, metrics and logs.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Admin, metrics and logs")]
pub struct AdminConfig {
    /// Admin HTTP address (`host:port`) serving /livez, /readyz and /metrics.
    #[arg(long, env = "ECHOMQ_ADMIN_LISTEN", default_value = DEFAULT_ADMIN_LISTEN)]
    pub admin_listen: SocketAddr,

    /// How often (milliseconds) each subscribed group's state (pending, lag,
    /// oldest pending age, …) is polled into the `/metrics` gauges. 0: never;
    /// else at least 100.
    #[arg(id = "metrics_poll_interval_ms", long = "metrics-poll-interval-ms", value_name = "METRICS_POLL_INTERVAL_MS", env = "ECHOMQ_METRICS_POLL_INTERVAL_MS",
          default_value = default_millis!(DEFAULT_METRICS_POLL_INTERVAL), value_parser = millis::off_or_at_least::<100>)]
    pub metrics_poll_interval: Duration,

    /// Log line format on standard error.
    #[arg(long, env = "ECHOMQ_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl AdminConfig {
    /// How often group state is polled into metrics; `None`: never (`--metrics-poll-interval-ms 0`).
    pub fn metrics_poll(&self) -> Option<Duration> {
        millis::unless_off(self.metrics_poll_interval)
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
