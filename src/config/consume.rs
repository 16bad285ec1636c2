//! The Consume call: this sidecar's consumer name, flow control, retries,
//! dead-lettering, the lease on held entries and the reclaim of others'.

use std::time::Duration;

use clap::Args;

use super::millis;

/// Default minimum PEL idle time before the reclaim beat takes an entry over.
pub const DEFAULT_RECLAIM_MIN_IDLE: Duration = Duration::from_secs(30);
/// Default period of the reclaim beat (XAUTOCLAIM).
pub const DEFAULT_RECLAIM_INTERVAL: Duration = Duration::from_secs(5);
/// Default cap (entries) of the adaptive window of a subscription that sends
/// `max_in_flight` 0.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 1024;
/// Default upper bound (entries) on a subscription's `max_in_flight`.
pub const DEFAULT_MAX_IN_FLIGHT_LIMIT: u32 = 10_000;
/// Default `max_deliveries` of a group whose subscription sends 0: no limit.
pub const DEFAULT_MAX_DELIVERIES: u32 = 0;
/// Default idle time after which a consumer that holds nothing is removed.
pub const DEFAULT_CONSUMER_IDLE_LIMIT: Duration = Duration::from_secs(3_600);
/// Default first retry delay after a Fail without `retry_after`.
pub const DEFAULT_RETRY_BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Default cap of the retry delay.
pub const DEFAULT_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Default XREADGROUP BLOCK timeout of a group's reader.
pub const DEFAULT_READ_BLOCK: Duration = Duration::from_secs(2);
/// Default period of the per-key gate's re-check of entries waiting for
/// their key, when nothing this sidecar settled freed it.
pub const DEFAULT_KEY_WAIT_POLL: Duration = Duration::from_millis(20);
/// Default most Consume calls open at once.
pub const DEFAULT_MAX_CONSUME_CALLS: usize = 1_024;
/// Highest `--max-consume-calls`: far above what one sidecar serves (each
/// call holds a subscription), and within what its call counter can hold.
pub const MAX_CONSUME_CALLS: u64 = 1_000_000;

/// How Consume calls are served.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Consume")]
pub struct ConsumeConfig {
    /// This sidecar's consumer name in every group; keep it stable across
    /// restarts of the same pod so a restart recovers its own pending entries.
    /// Default: $POD_NAME, else the host name.
    #[arg(long, env = "ECHOMQ_CONSUMER_NAME", value_parser = parse_consumer_name)]
    pub consumer_name: Option<String>,

    /// Minimum PEL idle time (milliseconds) after which the reclaim beat
    /// (XAUTOCLAIM) takes over an entry another consumer left. Held entries are
    /// kept fresh every third of it.
    #[arg(id = "reclaim_min_idle_ms", long = "reclaim-min-idle-ms", value_name = "RECLAIM_MIN_IDLE_MS", env = "ECHOMQ_RECLAIM_MIN_IDLE_MS",
          default_value = default_millis!(DEFAULT_RECLAIM_MIN_IDLE), value_parser = millis::within(100..))]
    pub reclaim_min_idle: Duration,

    /// Period of the reclaim beat (milliseconds).
    #[arg(id = "reclaim_interval_ms", long = "reclaim-interval-ms", value_name = "RECLAIM_INTERVAL_MS", env = "ECHOMQ_RECLAIM_INTERVAL_MS",
          default_value = default_millis!(DEFAULT_RECLAIM_INTERVAL), value_parser = millis::within(10..))]
    pub reclaim_interval: Duration,

    /// The most entries (`max_in_flight`) a subscription that sends 0 may
    /// hold: its window starts at 64 and grows (doubling) while the client
    /// keeps up and shrinks (by a quarter, down to 8) when it falls behind,
    /// judged by the time from delivery to verdict. A subscription that sets
    /// `max_in_flight` gets exactly that, fixed.
    /// Unset: 1024, or `--max-in-flight-limit` if that is lower (docs:
    /// How Consume behaves, "Flow control").
    #[arg(id = "default_max_in_flight", long = "default-max-in-flight", value_name = "DEFAULT_MAX_IN_FLIGHT", env = "ECHOMQ_DEFAULT_MAX_IN_FLIGHT",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub default_max_in_flight_set: Option<u32>,

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
    #[arg(id = "consumer_idle_limit_ms", long = "consumer-idle-limit-ms", value_name = "CONSUMER_IDLE_LIMIT_MS", env = "ECHOMQ_CONSUMER_IDLE_LIMIT_MS",
          default_value = default_millis!(DEFAULT_CONSUMER_IDLE_LIMIT), value_parser = millis::off_or_at_least::<1_000>)]
    pub consumer_idle_limit: Duration,

    /// Deliveries after which an entry is dead-lettered, for subscriptions
    /// that send `max_deliveries` 0; 0: no limit.
    #[arg(long, env = "ECHOMQ_DEFAULT_MAX_DELIVERIES", default_value_t = DEFAULT_MAX_DELIVERIES)]
    pub default_max_deliveries: u32,

    /// First retry delay (milliseconds) after a Fail without `retry_after` or a
    /// dropped call; doubled per attempt, with jitter, up to the maximum.
    #[arg(id = "retry_backoff_initial_ms", long = "retry-backoff-initial-ms", value_name = "RETRY_BACKOFF_INITIAL_MS", env = "ECHOMQ_RETRY_BACKOFF_INITIAL_MS",
          default_value = default_millis!(DEFAULT_RETRY_BACKOFF_INITIAL), value_parser = millis::within(..))]
    pub retry_backoff_initial: Duration,

    /// Cap of the retry delay (milliseconds).
    #[arg(id = "retry_backoff_max_ms", long = "retry-backoff-max-ms", value_name = "RETRY_BACKOFF_MAX_MS", env = "ECHOMQ_RETRY_BACKOFF_MAX_MS",
          default_value = default_millis!(DEFAULT_RETRY_BACKOFF_MAX), value_parser = millis::within(..))]
    pub retry_backoff_max: Duration,

    /// XREADGROUP BLOCK timeout (milliseconds) of a group's reader. A read
    /// with no reply within this plus --redis-timeout-ms (a black-holed or
    /// stalled Redis) is given up and retried on a new connection.
    #[arg(id = "read_block_ms", long = "read-block-ms", value_name = "READ_BLOCK_MS", env = "ECHOMQ_READ_BLOCK_MS",
          default_value = default_millis!(DEFAULT_READ_BLOCK), value_parser = millis::within(1..))]
    pub read_block: Duration,

    /// Per-key limits (`Subscribe.key_field`): how often (milliseconds) the
    /// entries that wait for their key are checked again while any waits
    /// (one `keys_gate.lua` run per group, for each key's first waiting
    /// entries). An entry this sidecar settles frees its key's waiting
    /// entries at once; the poll is for keys freed elsewhere (a peer, an
    /// operator, a reclaim). Never runs while none waits.
    #[arg(id = "key_wait_poll_ms", long = "key-wait-poll-ms", value_name = "KEY_WAIT_POLL_MS", env = "ECHOMQ_KEY_WAIT_POLL_MS",
          default_value = default_millis!(DEFAULT_KEY_WAIT_POLL), value_parser = millis::within(1..))]
    pub key_wait_poll: Duration,

    /// Most Consume calls open at once (RESOURCE_EXHAUSTED above); 1 to 1,000,000.
    #[arg(long, env = "ECHOMQ_MAX_CONSUME_CALLS", default_value_t = DEFAULT_MAX_CONSUME_CALLS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_CONSUME_CALLS))]
    pub max_consume_calls: usize,
}

impl ConsumeConfig {
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

    /// How often held entries' idle time is refreshed: a third of the reclaim
    /// minimum idle time in whole milliseconds, at least 10 ms, so two
    /// refreshes can fail before a peer may reclaim.
    pub fn lease_refresh_interval(&self) -> Duration {
        let third_ms = u64::try_from(self.reclaim_min_idle.as_millis() / 3).unwrap_or(u64::MAX);
        Duration::from_millis(third_ms.max(10))
    }

    /// After how long an idle consumer is removed; `None`: never (`--consumer-idle-limit-ms 0`).
    pub fn consumer_removal(&self) -> Option<Duration> {
        millis::unless_off(self.consumer_idle_limit)
    }

    /// The cap (entries) of the adaptive window of a subscription that sends
    /// `max_in_flight` 0: `--default-max-in-flight`, else
    /// [`DEFAULT_MAX_IN_FLIGHT`] within `--max-in-flight-limit`.
    pub fn default_max_in_flight(&self) -> u32 {
        self.default_max_in_flight_set.unwrap_or(DEFAULT_MAX_IN_FLIGHT.min(self.max_in_flight_limit))
    }

    /// Checks the defaults against their limits.
    pub(super) fn validate(&self) -> Result<(), String> {
        if let Some(default) = self.default_max_in_flight_set.filter(|&n| n > self.max_in_flight_limit) {
            return Err(format!(
                "--default-max-in-flight ({default}) is above --max-in-flight-limit ({})",
                self.max_in_flight_limit
            ));
        }
        if self.retry_backoff_initial > self.retry_backoff_max {
            return Err(format!(
                "--retry-backoff-initial-ms ({}) is above --retry-backoff-max-ms ({})",
                self.retry_backoff_initial.as_millis(),
                self.retry_backoff_max.as_millis()
            ));
        }
        Ok(())
    }
}

fn parse_consumer_name(text: &str) -> Result<String, String> {
    let name = super::parse_non_empty(text)?;
    if name.len() > 256 {
        return Err("a consumer name is at most 256 bytes".into());
    }
    Ok(name)
}
