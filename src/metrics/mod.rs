//! Prometheus metrics, served as text on the admin port's `/metrics`.
//!
//! Names follow Prometheus conventions: the `echomq_` prefix, base units in
//! the name (`_seconds`), `_total` on counters (added by the encoder). Labels
//! are the stream and group (bounded by what the sidecar's clients subscribe
//! and append to), the worker's Redis operation, a verdict error's code, the
//! Redis command name, or why a reader connection was closed. Beside them,
//! unprefixed, the standard process metrics (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, …: [`process`]), the gRPC server's calls
//! by grpc-prometheus' names (`grpc_server_handled_total`, …: [`grpc`]) and
//! `echomq_build_info{version}`.
//!
//! Label values are short snake_case words (`read`, `unknown_id`,
//! `health_check`), except where a value is another domain's own word, kept
//! as that domain spells it so it can be looked up there: a Redis command
//! (`XACK`, `EVALSHA` as `script:settle`), a gRPC service, method and code
//! (`echomq.v1.StreamService`, `Append`, `NotFound`).
//!
//! A subscribed group's series are all present from the group's first call,
//! at zero, so `rate()` and `increase()` need no first event; only
//! `echomq_group_lag` is absent, while Redis cannot say. An error that
//! belongs to a group carries its `stream` and `group`. An expected recovery
//! is not an error: a group re-created after NOGROUP counts in
//! `echomq_group_recreations_total` only.
//!
//! # One owner per metric
//!
//! Each group of series is declared, registered and recorded in one file,
//! by a `register(&mut Registry)` constructor beside the code that records
//! it (as linkerd2-proxy's pool metrics do): [`group`] (per group),
//! [`stream`] (appends, trims), [`archive`], [`grpc`]; and, below this
//! module so that redis/ imports nothing of it, the connections' own:
//! [`crate::redis::timed`] (every command), [`crate::redis::primary`]
//! (switches), [`crate::redis::readers`] (the reader pool). This file only
//! makes the registry, calls them, and encodes. Adding a metric touches its
//! group's file (and the docs).

use std::sync::Arc;

pub mod archive;
pub mod group;
pub mod grpc;
mod process;
pub mod stream;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
    registry::{Metric, Registry},
};

pub use archive::{ArchiveExtent, ArchiveMetrics};
pub use group::{CodeLabels, GroupLabels, GroupMetrics, OperationLabels, VerdictErrors};
pub use stream::{StreamLabels, StreamMetrics};

use crate::redis::{readers::ReaderPoolMetrics, RedisMetrics};

/// The label of `echomq_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    /// The crate's version (`CARGO_PKG_VERSION`).
    version: &'static str,
}

/// Registers `metric` in `registry` as `name` with `help`, and hands it
/// back: a group's series is created and registered in one expression.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Every metric of the sidecar, and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    /// Every subscribed group's series.
    groups: group::GroupFamilies,
    /// The StreamService's series (appends, trims).
    pub streams: StreamMetrics,
    /// The archive's series.
    pub archive: ArchiveMetrics,
    grpc: grpc::GrpcMetrics,
    /// The connections' series, registered by redis/ itself.
    redis: RedisMetrics,
    /// The reader pool's series, registered by `redis/readers.rs` itself.
    reader_pool: ReaderPoolMetrics,
}

impl Metrics {
    /// Creates every group of series, each registering itself.
    pub fn new() -> Metrics {
        let mut root = Registry::default();
        root.register_collector(Box::new(process::ProcessCollector));
        let registry = root.sub_registry_with_prefix("echomq");
        let build = Family::<BuildLabels, Gauge>::default();
        build.get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION") }).set(1);
        registry.register("build_info", "The sidecar's version; always 1", build);
        let redis = RedisMetrics::register(registry);
        let groups = group::GroupFamilies::register(registry);
        let streams = StreamMetrics::register(registry);
        let archive = ArchiveMetrics::register(registry);
        let reader_pool = ReaderPoolMetrics::register(registry);
        let grpc = grpc::GrpcMetrics::register(&mut root);
        Metrics { registry: root, groups, streams, archive, grpc, redis, reader_pool }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        self.reader_pool.refresh();
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }

    /// The handles of one group's series, looked up once so the hot path only
    /// touches atomics. The group's stream's series (appends, trims) are
    /// created too, so `rate()` over a subscribed stream needs no first event.
    pub fn group(&self, stream: &str, sharded_stream: &str, group: &str) -> GroupMetrics {
        let labels = GroupLabels::new(stream, sharded_stream, group);
        self.streams.subscribed(&labels);
        self.groups.handles(labels)
    }

    /// Removes the series [`Metrics::group`] made for this group (and
    /// `operations`' `echomq_redis_errors_total` series), once no worker
    /// serves it here: each is then absent from the exposition rather than
    /// frozen at its last value. Its stream's series (appends, trimmed
    /// unread) go only while still at zero, the appends only when no other
    /// group of the stream is served here (`stream_served` false).
    pub fn forget_group(
        &self,
        stream: &str,
        sharded_stream: &str,
        group: &str,
        operations: &[&'static str],
        stream_served: bool,
    ) {
        let labels = GroupLabels::new(stream, sharded_stream, group);
        self.groups.remove(&labels, operations);
        self.streams.unsubscribed(&labels, stream_served);
    }

    /// One group's verdict error counters (as in [`Metrics::group`]), for the
    /// answers a call's relay gives itself.
    pub fn verdict_errors(&self, stream: &str, sharded_stream: &str, group: &str) -> VerdictErrors {
        self.groups.verdict_errors(&GroupLabels::new(stream, sharded_stream, group))
    }

    /// The gRPC server's call counters, for [`grpc::GrpcLayer`].
    pub fn grpc(&self) -> grpc::GrpcMetrics {
        self.grpc.clone()
    }

    /// The connections' series, for [`Redis::connect`](crate::redis::Redis::connect).
    pub fn redis(&self) -> RedisMetrics {
        self.redis.clone()
    }
}

/// The reader pool's series, for [`crate::redis::readers::ReaderPool::new`].
impl AsRef<ReaderPoolMetrics> for Arc<Metrics> {
    fn as_ref(&self) -> &ReaderPoolMetrics {
        &self.reader_pool
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}
