//! The shared connection's every command timed: [`TimedConnection`] wraps
//! it, and [`CommandMetrics`] (`echomq_redis_command_*`) is the series it
//! records, registered here beside the code that records it, so redis/
//! needs nothing of metrics/.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};
use redis::{aio::ConnectionLike, Cmd, Pipeline, RedisFuture, Value};
use tracing::Instrument;

use super::fault::{fault, Fault};

/// The buckets of every latency histogram of the sidecar (seconds): 100 µs to ~100 s.
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 4.0, 11))
}

/// Labels of Redis latency: the command (`XACK`, `EVALSHA`, … or `pipeline`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabels {
    /// The command name, upper case.
    pub command: String,
}

/// The shared connection's series, by command. Cheap to clone.
#[derive(Clone)]
pub struct CommandMetrics {
    /// `echomq_redis_command_errors_total{command}`.
    errors: Family<CommandLabels, Counter>,
    /// `echomq_redis_command_duration_seconds{command}`.
    seconds: Family<CommandLabels, Histogram>,
}

impl CommandMetrics {
    /// Creates the series and registers them in `registry` (the `echomq_` one).
    pub fn register(registry: &mut Registry) -> CommandMetrics {
        let metrics =
            CommandMetrics { errors: Family::default(), seconds: Family::new_with_constructor(latency_histogram) };
        registry.register(
            "redis_command_errors",
            "Failed commands on the shared Redis connection (every call's and worker's), by command",
            metrics.errors.clone(),
        );
        registry.register(
            "redis_command_duration_seconds",
            "Latency of commands on the shared Redis connection",
            metrics.seconds.clone(),
        );
        metrics
    }

    fn observe(&self, command: &str, elapsed: Duration, failed: bool) {
        let labels = CommandLabels { command: command.to_owned() };
        self.seconds.get_or_create(&labels).observe(elapsed.as_secs_f64());
        if failed {
            self.errors.get_or_create(&labels).inc();
        }
    }
}

/// The shared Redis connection with every command's latency observed.
#[derive(Clone)]
pub struct TimedConnection<C> {
    inner: C,
    metrics: CommandMetrics,
    /// Script SHA1 → file name, so EVALSHA is labelled `script:<name>`.
    scripts: Arc<HashMap<String, &'static str>>,
}

impl<C> TimedConnection<C> {
    /// Wraps `inner`; `scripts` names the scripts it runs by their SHA1.
    pub fn new(inner: C, metrics: CommandMetrics, scripts: HashMap<String, &'static str>) -> Self {
        TimedConnection { inner, metrics, scripts: Arc::new(scripts) }
    }

    /// The `command` label: the command name, or `script:<name>` for a script.
    fn label(&self, cmd: &Cmd) -> String {
        let mut args = cmd.args_iter();
        let name = match args.next() {
            Some(redis::Arg::Simple(name)) => String::from_utf8_lossy(name).to_ascii_uppercase(),
            _ => return "unknown".to_owned(),
        };
        if name == "EVALSHA" || name == "EVAL" {
            if let Some(redis::Arg::Simple(sha)) = args.next() {
                if let Some(script) = std::str::from_utf8(sha).ok().and_then(|sha| self.scripts.get(sha)) {
                    return format!("script:{script}");
                }
            }
        }
        name
    }
}

/// Error replies that are answers the sidecar expects and acts on, not
/// failures of the command: NOSCRIPT (the script cache asking for EVAL),
/// BUSYGROUP (the group door finding the group there), NOGROUP (a group
/// gone: a worker re-creates it, counted in `echomq_group_recreations_total`;
/// a call about a missing group is answered NOT_FOUND, counted by the gRPC
/// server's metrics).
fn expected_reply(error: &redis::RedisError) -> bool {
    error.code() == Some("NOSCRIPT") || matches!(fault(error), Fault::BusyGroup | Fault::NoGroup)
}

impl<C: ConnectionLike + Send> ConnectionLike for TimedConnection<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let command = self.label(cmd);
        // A span per command only while traces are exported, and only inside
        // an operation's span (see the function).
        let span = crate::telemetry::redis_command_span(&command);
        Box::pin(
            async move {
                let started = Instant::now();
                let result = self.inner.req_packed_command(cmd).await;
                let failed = result.as_ref().is_err_and(|e| !expected_reply(e));
                self.metrics.observe(&command, started.elapsed(), failed);
                result
            }
            .instrument(span),
        )
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let started = Instant::now();
            let result = self.inner.req_packed_commands(pipeline, offset, count).await;
            self.metrics.observe("pipeline", started.elapsed(), result.is_err());
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}
