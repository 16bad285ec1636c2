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

use std::sync::Arc;

pub mod grpc;
mod process;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::{
    proto::VerdictErrorCode,
    redis::{readers::ReaderPoolMetrics, timed::latency_histogram, RedisMetrics},
};

/// Labels of per-group series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabels {
    /// The stream key (a shard's key, for a sharded stream).
    pub stream: String,
    /// The stream as subscribed: a sharded stream's name, else the stream
    /// key again; `sum by (sharded_stream, group)` adds up a sharded stream.
    pub sharded_stream: String,
    /// The consumer group.
    pub group: String,
}

/// The label of `echomq_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    /// The crate's version (`CARGO_PKG_VERSION`).
    version: &'static str,
}

/// Labels of a group worker's Redis errors: the group, and what the worker was doing.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// The group the failed step worked for.
    #[prometheus(flatten)]
    pub group: GroupLabels,
    /// The worker's step, a short snake_case word: `read`, `recover`, `settle`, …
    pub operation: &'static str,
}

/// Labels of verdict errors: the group, and the error's code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    /// The group of the call that got the answer.
    #[prometheus(flatten)]
    pub group: GroupLabels,
    /// The `VerdictErrorCode` in snake_case, without its prefix: see [`VerdictErrors::CODES`].
    pub code: &'static str,
}

/// Labels of per-stream series (appends): the stream key, and the stream as
/// appended to (a sharded stream's name), as in [`GroupLabels`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    /// The stream key written (a shard's key, for a sharded stream).
    pub stream: String,
    /// The stream as named in the call: a sharded stream's name, else the key again.
    pub sharded_stream: String,
}

type GroupCounter = Family<GroupLabels, Counter>;
type GroupGauge = Family<GroupLabels, Gauge>;
type GroupGaugeF64 = Family<GroupLabels, Gauge<f64, std::sync::atomic::AtomicU64>>;

/// Every metric of the sidecar, and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    deliveries: GroupCounter,
    acks: GroupCounter,
    fails: GroupCounter,
    dead_letters: GroupCounter,
    reclaimed: GroupCounter,
    lease_refreshes: GroupCounter,
    leases_lost: GroupCounter,
    acks_not_pending: GroupCounter,
    trimmed_while_pending: GroupCounter,
    group_recreations: GroupCounter,
    verdict_errors: Family<CodeLabels, Counter>,
    consume_calls: GroupGauge,
    appends: Family<StreamLabels, Counter>,
    trimmed_unread: GroupCounter,
    in_flight: GroupGauge,
    handler_seconds: Family<GroupLabels, Histogram>,
    pending: GroupGauge,
    lag: GroupGauge,
    oldest_pending_age_seconds: GroupGaugeF64,
    max_delivery_count: GroupGauge,
    consumers: GroupGauge,
    stream_length: GroupGauge,
    redis_errors: Family<OperationLabels, Counter>,
    grpc: grpc::GrpcMetrics,
    archive: ArchiveMetrics,
    /// The connections' series, registered by redis/ itself.
    redis: RedisMetrics,
    /// The reader pool's series, registered by `redis/readers.rs` itself.
    reader_pool: ReaderPoolMetrics,
}

/// The archive's series (`echomq_archive_*`), per stream key.
struct ArchiveMetrics {
    folded_entries: Family<StreamLabels, Counter>,
    folded_bytes: Family<StreamLabels, Counter>,
    fold_errors: Family<StreamLabels, Counter>,
    fold_seconds: Family<StreamLabels, Histogram>,
    files: Family<StreamLabels, Gauge>,
    bytes: Family<StreamLabels, Gauge>,
    entries: Family<StreamLabels, Gauge>,
    oldest_seconds: Family<StreamLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

/// What the archive holds of one stream key, for [`Metrics::archive_extent`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArchiveExtent {
    /// Archive files.
    pub files: u64,
    /// Their size (bytes).
    pub bytes: u64,
    /// Archived entries.
    pub entries: u64,
    /// The oldest archived entry's stream id milliseconds (unix ms); `None` when empty.
    pub oldest_ms: Option<u64>,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Metrics {
        let mut root = Registry::default();
        root.register_collector(Box::new(process::ProcessCollector));
        let registry = root.sub_registry_with_prefix("echomq");
        let build = Family::<BuildLabels, Gauge>::default();
        build.get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION") }).set(1);
        registry.register("build_info", "The sidecar's version; always 1", build);
        let mut m = Metrics {
            deliveries: Family::default(),
            acks: Family::default(),
            fails: Family::default(),
            dead_letters: Family::default(),
            reclaimed: Family::default(),
            lease_refreshes: Family::default(),
            leases_lost: Family::default(),
            acks_not_pending: Family::default(),
            trimmed_while_pending: Family::default(),
            group_recreations: Family::default(),
            verdict_errors: Family::default(),
            consume_calls: Family::default(),
            appends: Family::default(),
            trimmed_unread: Family::default(),
            in_flight: Family::default(),
            handler_seconds: Family::new_with_constructor(latency_histogram),
            pending: Family::default(),
            lag: Family::default(),
            oldest_pending_age_seconds: Family::default(),
            max_delivery_count: Family::default(),
            consumers: Family::default(),
            stream_length: Family::default(),
            redis_errors: Family::default(),
            grpc: grpc::GrpcMetrics::new(),
            archive: ArchiveMetrics {
                folded_entries: Family::default(),
                folded_bytes: Family::default(),
                fold_errors: Family::default(),
                fold_seconds: Family::new_with_constructor(latency_histogram),
                files: Family::default(),
                bytes: Family::default(),
                entries: Family::default(),
                oldest_seconds: Family::default(),
            },
            redis: RedisMetrics::register(registry),
            reader_pool: ReaderPoolMetrics::register(registry),
            registry: Registry::default(),
        };
        let r = registry;
        r.register("deliveries", "Entries handed to clients (each hand-over counts)", m.deliveries.clone());
        r.register("acks", "Entries acknowledged (XACK found them pending)", m.acks.clone());
        r.register("fails", "Fail verdicts, deadlines passed and calls ended holding entries", m.fails.clone());
        r.register("dead_letters", "Entries moved to a dead-letter stream", m.dead_letters.clone());
        r.register("reclaimed", "Entries taken over from idle consumers (XAUTOCLAIM)", m.reclaimed.clone());
        r.register("lease_refreshes", "Held entries whose PEL idle time was refreshed", m.lease_refreshes.clone());
        r.register("leases_lost", "Held entries a peer reclaimed before their verdict", m.leases_lost.clone());
        r.register(
            "acks_not_pending",
            "Acks XACK found no longer pending (nothing applied)",
            m.acks_not_pending.clone(),
        );
        r.register(
            "trimmed_while_pending",
            "Pending entries found deleted from their stream and dropped from the PEL",
            m.trimmed_while_pending.clone(),
        );
        r.register(
            "group_recreations",
            "Groups re-created after NOGROUP (an expected recovery, not counted as a Redis error)",
            m.group_recreations.clone(),
        );
        r.register(
            "verdict_errors",
            "Verdicts answered with a VerdictError and not applied, by code",
            m.verdict_errors.clone(),
        );
        r.register("consume_calls", "Consume calls attached to the group now (open)", m.consume_calls.clone());
        r.register(
            "appends",
            "Entries appended (Append, AppendBatch), counted once Redis confirmed",
            m.appends.clone(),
        );
        let a = &m.archive;
        r.register("archive_folded_entries", "Entries folded into the archive", a.folded_entries.clone());
        r.register("archive_folded_bytes", "Bytes of archive files written", a.folded_bytes.clone());
        r.register(
            "archive_fold_errors",
            "Folds that failed (the store refused, Redis failed); nothing was trimmed past the archive",
            a.fold_errors.clone(),
        );
        r.register("archive_fold_duration_seconds", "Time of one fold-then-trim", a.fold_seconds.clone());
        r.register("archive_files", "Archive files of the stream", a.files.clone());
        r.register("archive_bytes", "Bytes of the stream's archive files", a.bytes.clone());
        r.register("archive_entries", "Entries of the stream in the archive", a.entries.clone());
        r.register(
            "archive_oldest_entry_timestamp_seconds",
            "When the oldest archived entry was appended (unix seconds, from its stream id)",
            a.oldest_seconds.clone(),
        );
        r.register(
            "trimmed_unread",
            "Entries a trim removed (Trim with ignore_groups, an Append's max_len) before the group was delivered them",
            m.trimmed_unread.clone(),
        );
        r.register("in_flight", "Deliveries held by clients, waiting for a verdict", m.in_flight.clone());
        r.register("handler_duration_seconds", "Time from delivery to verdict", m.handler_seconds.clone());
        r.register("group_pending", "Entries in the group's PEL (polled)", m.pending.clone());
        r.register("group_lag", "Entries not yet read by the group (polled; absent when unknown)", m.lag.clone());
        r.register(
            "group_oldest_pending_age_seconds",
            "Age of the group's oldest pending entry (polled)",
            m.oldest_pending_age_seconds.clone(),
        );
        r.register(
            "group_max_delivery_count",
            "Highest delivery count among the oldest pending entries (polled)",
            m.max_delivery_count.clone(),
        );
        r.register("group_consumers", "Consumers in the group (polled)", m.consumers.clone());
        r.register("stream_length", "Entries in the stream (polled)", m.stream_length.clone());
        r.register(
            "redis_errors",
            "Failed Redis steps of group workers, by group and operation (NOGROUP, recovered, is not one)",
            m.redis_errors.clone(),
        );
        m.grpc.register(&mut root);
        m.registry = root;
        m
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        self.reader_pool.refresh();
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }

    /// The handles of one group's series, looked up once so the hot path only
    /// touches atomics.
    pub fn group(&self, stream: &str, sharded_stream: &str, group: &str) -> GroupMetrics {
        let labels = GroupLabels {
            stream: stream.to_owned(),
            sharded_stream: sharded_stream.to_owned(),
            group: group.to_owned(),
        };
        let _ = self.trimmed_unread.get_or_create(&labels);
        // The stream's appends from the start too, so `rate()` over a
        // subscribed stream needs no first append.
        let _ = self.appends.get_or_create(&StreamLabels {
            stream: labels.stream.clone(),
            sharded_stream: labels.sharded_stream.clone(),
        });
        GroupMetrics {
            deliveries: self.deliveries.get_or_create(&labels).clone(),
            acks: self.acks.get_or_create(&labels).clone(),
            fails: self.fails.get_or_create(&labels).clone(),
            dead_letters: self.dead_letters.get_or_create(&labels).clone(),
            reclaimed: self.reclaimed.get_or_create(&labels).clone(),
            lease_refreshes: self.lease_refreshes.get_or_create(&labels).clone(),
            leases_lost: self.leases_lost.get_or_create(&labels).clone(),
            acks_not_pending: self.acks_not_pending.get_or_create(&labels).clone(),
            trimmed_while_pending: self.trimmed_while_pending.get_or_create(&labels).clone(),
            group_recreations: self.group_recreations.get_or_create(&labels).clone(),
            verdict_errors: VerdictErrors::new(&self.verdict_errors, &labels),
            consume_calls: self.consume_calls.get_or_create(&labels).clone(),
            in_flight: self.in_flight.get_or_create(&labels).clone(),
            handler_seconds: self.handler_seconds.get_or_create(&labels).clone(),
            pending: self.pending.get_or_create(&labels).clone(),
            oldest_pending_age_seconds: self.oldest_pending_age_seconds.get_or_create(&labels).clone(),
            max_delivery_count: self.max_delivery_count.get_or_create(&labels).clone(),
            consumers: self.consumers.get_or_create(&labels).clone(),
            stream_length: self.stream_length.get_or_create(&labels).clone(),
            lag_family: self.lag.clone(),
            redis_errors_family: self.redis_errors.clone(),
            labels,
        }
    }

    /// One group's verdict error counters (as in [`Metrics::group`]), for the
    /// answers a call's relay gives itself.
    pub fn verdict_errors(&self, stream: &str, sharded_stream: &str, group: &str) -> VerdictErrors {
        let labels = GroupLabels {
            stream: stream.to_owned(),
            sharded_stream: sharded_stream.to_owned(),
            group: group.to_owned(),
        };
        VerdictErrors::new(&self.verdict_errors, &labels)
    }

    /// Counts `entries` appended to `stream` (a sharded stream's shard key:
    /// `sharded_stream` names the sharded stream), once Redis confirmed them.
    pub fn appended(&self, stream: &str, sharded_stream: &str, entries: usize) {
        let labels = StreamLabels { stream: stream.to_owned(), sharded_stream: sharded_stream.to_owned() };
        self.appends.get_or_create(&labels).inc_by(entries as u64);
    }

    /// Counts `entries` of `stream` removed by a trim before `group` was
    /// delivered them (`echomq_trimmed_unread_total`).
    pub fn trimmed_unread(&self, stream: &str, sharded_stream: &str, group: &str, entries: u64) {
        let labels = GroupLabels {
            stream: stream.to_owned(),
            sharded_stream: sharded_stream.to_owned(),
            group: group.to_owned(),
        };
        self.trimmed_unread.get_or_create(&labels).inc_by(entries);
    }

    /// Counts a fold of `entries` into archive files of `bytes`.
    pub fn archive_folded(&self, stream: &str, sharded_stream: &str, entries: u64, bytes: u64) {
        let labels = StreamLabels { stream: stream.to_owned(), sharded_stream: sharded_stream.to_owned() };
        self.archive.folded_entries.get_or_create(&labels).inc_by(entries);
        self.archive.folded_bytes.get_or_create(&labels).inc_by(bytes);
    }

    /// Counts a fold of `stream` that failed.
    pub fn archive_fold_error(&self, stream: &str, sharded_stream: &str) {
        let labels = StreamLabels { stream: stream.to_owned(), sharded_stream: sharded_stream.to_owned() };
        self.archive.fold_errors.get_or_create(&labels).inc();
    }

    /// Records how long one fold-then-trim of `stream` took.
    pub fn archive_fold_duration(&self, stream: &str, sharded_stream: &str, took: std::time::Duration) {
        let labels = StreamLabels { stream: stream.to_owned(), sharded_stream: sharded_stream.to_owned() };
        self.archive.fold_seconds.get_or_create(&labels).observe(took.as_secs_f64());
    }

    /// Sets what the archive holds of `stream`.
    pub fn archive_extent(&self, stream: &str, sharded_stream: &str, extent: ArchiveExtent) {
        let labels = StreamLabels { stream: stream.to_owned(), sharded_stream: sharded_stream.to_owned() };
        let a = &self.archive;
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        a.files.get_or_create(&labels).set(gauge(extent.files));
        a.bytes.get_or_create(&labels).set(gauge(extent.bytes));
        a.entries.get_or_create(&labels).set(gauge(extent.entries));
        if let Some(ms) = extent.oldest_ms {
            a.oldest_seconds.get_or_create(&labels).set(ms as f64 / 1000.0);
        }
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

/// One group's series (see [`Metrics::group`]). Cheap to clone: every handle
/// is an `Arc` around an atomic, so the hot path never hashes labels.
#[derive(Clone)]
pub struct GroupMetrics {
    /// `echomq_deliveries_total`: hand-overs to clients (entries).
    pub deliveries: Counter,
    /// `echomq_acks_total`: entries XACK confirmed (entries).
    pub acks: Counter,
    /// `echomq_fails_total`: Fail verdicts, passed deadlines, calls ended holding entries.
    pub fails: Counter,
    /// `echomq_dead_letters_total`: entries moved to the dead-letter stream.
    pub dead_letters: Counter,
    /// `echomq_reclaimed_total`: entries taken over by XAUTOCLAIM.
    pub reclaimed: Counter,
    /// `echomq_lease_refreshes_total`: held entries whose idle time was reset.
    pub lease_refreshes: Counter,
    /// `echomq_leases_lost_total`: held entries a peer reclaimed.
    pub leases_lost: Counter,
    /// `echomq_acks_not_pending_total`: acks XACK found no longer pending.
    pub acks_not_pending: Counter,
    /// `echomq_trimmed_while_pending_total`: pending entries found deleted.
    pub trimmed_while_pending: Counter,
    /// `echomq_group_recreations_total`: groups re-created after NOGROUP.
    pub group_recreations: Counter,
    /// `echomq_verdict_errors_total{code}`: verdicts answered with a VerdictError.
    pub verdict_errors: VerdictErrors,
    /// `echomq_consume_calls`: Consume calls attached to this group's worker now.
    pub consume_calls: Gauge,
    /// `echomq_in_flight`: deliveries held by calls now (entries).
    pub in_flight: Gauge,
    /// `echomq_handler_duration_seconds`: hand-over to verdict (seconds).
    pub handler_seconds: Histogram,
    /// `echomq_group_pending` (polled): the PEL's size (entries).
    pub pending: Gauge,
    /// `echomq_group_oldest_pending_age_seconds` (polled, seconds).
    pub oldest_pending_age_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// `echomq_group_max_delivery_count` (polled).
    pub max_delivery_count: Gauge,
    /// `echomq_group_consumers` (polled).
    pub consumers: Gauge,
    /// `echomq_stream_length` (polled, entries).
    pub stream_length: Gauge,
    lag_family: GroupGauge,
    redis_errors_family: Family<OperationLabels, Counter>,
    labels: GroupLabels,
}

impl GroupMetrics {
    /// The `echomq_redis_errors_total` series of this group's `operation`
    /// (a short snake_case word); created at zero by the first look-up.
    pub fn redis_errors(&self, operation: &'static str) -> Counter {
        self.redis_errors_family.get_or_create(&OperationLabels { group: self.labels.clone(), operation }).clone()
    }

    /// Sets the lag, or removes the series when Redis cannot say (so a stale
    /// value is never shown).
    pub fn set_lag(&self, lag: Option<u64>) {
        match lag {
            Some(lag) => {
                self.lag_family.get_or_create(&self.labels).set(lag as i64);
            }
            None => {
                self.lag_family.remove(&self.labels);
            }
        }
    }
}

/// One group's `echomq_verdict_errors_total` series, one per code, all
/// present from the start. Cheap to clone.
#[derive(Clone, Debug)]
pub struct VerdictErrors {
    /// In the order of [`VerdictErrors::CODES`].
    counters: [Counter; 5],
}

impl VerdictErrors {
    /// Every code a verdict error carries, as its `code` label: the
    /// `VerdictErrorCode` name without its prefix, in snake_case.
    pub const CODES: [(VerdictErrorCode, &'static str); 5] = [
        (VerdictErrorCode::UnknownId, "unknown_id"),
        (VerdictErrorCode::NotPending, "not_pending"),
        (VerdictErrorCode::InvalidArgument, "invalid_argument"),
        (VerdictErrorCode::Unavailable, "unavailable"),
        (VerdictErrorCode::LeaseLost, "lease_lost"),
    ];

    fn new(family: &Family<CodeLabels, Counter>, group: &GroupLabels) -> VerdictErrors {
        VerdictErrors {
            counters: Self::CODES
                .map(|(_, code)| family.get_or_create(&CodeLabels { group: group.clone(), code }).clone()),
        }
    }

    /// Counts one verdict error of `code` (as `VerdictError.code` carries it;
    /// an unspecified or unknown code is not counted: the sidecar sends none).
    pub fn count(&self, code: i32) {
        if let Some(at) = Self::CODES.iter().position(|(known, _)| *known as i32 == code) {
            self.counters[at].inc();
        }
    }
}
