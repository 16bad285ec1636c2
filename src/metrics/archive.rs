//! The archive's series (`echomq_archive_*`), per stream key: declared and
//! registered once, in [`ArchiveMetrics::register`]. Adding one touches
//! this file only (and the docs).

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::{registered, stream::StreamLabels};
use crate::redis::timed::latency_histogram;

/// What the archive holds of one stream key, for [`ArchiveMetrics::extent`].
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

/// The archive's series. Cheap to clone.
#[derive(Clone)]
pub struct ArchiveMetrics {
    folded_entries: Family<StreamLabels, Counter>,
    folded_bytes: Family<StreamLabels, Counter>,
    fold_errors: Family<StreamLabels, Counter>,
    fold_seconds: Family<StreamLabels, Histogram>,
    files: Family<StreamLabels, Gauge>,
    bytes: Family<StreamLabels, Gauge>,
    entries: Family<StreamLabels, Gauge>,
    oldest_seconds: Family<StreamLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

impl ArchiveMetrics {
    /// Creates the series and registers them in `r` (the `echomq_` registry).
    pub fn register(r: &mut Registry) -> ArchiveMetrics {
        ArchiveMetrics {
            folded_entries: registered(
                r,
                "archive_folded_entries",
                "Entries folded into the archive",
                Family::default(),
            ),
            folded_bytes: registered(r, "archive_folded_bytes", "Bytes of archive files written", Family::default()),
            fold_errors: registered(
                r,
                "archive_fold_errors",
                "Folds that failed (the store refused, Redis failed); nothing was trimmed past the archive",
                Family::default(),
            ),
            fold_seconds: registered(
                r,
                "archive_fold_duration_seconds",
                "Time of one fold-then-trim",
                Family::new_with_constructor(latency_histogram),
            ),
            files: registered(r, "archive_files", "Archive files of the stream", Family::default()),
            bytes: registered(r, "archive_bytes", "Bytes of the stream's archive files", Family::default()),
            entries: registered(r, "archive_entries", "Entries of the stream in the archive", Family::default()),
            oldest_seconds: registered(
                r,
                "archive_oldest_entry_timestamp_seconds",
                "When the oldest archived entry was appended (unix seconds, from its stream id)",
                Family::default(),
            ),
        }
    }

    /// Counts a fold of `entries` into archive files of `bytes`.
    pub fn folded(&self, stream: &str, sharded_stream: &str, entries: u64, bytes: u64) {
        let labels = StreamLabels::new(stream, sharded_stream);
        self.folded_entries.get_or_create(&labels).inc_by(entries);
        self.folded_bytes.get_or_create(&labels).inc_by(bytes);
    }

    /// Counts a fold of `stream` that failed.
    pub fn fold_error(&self, stream: &str, sharded_stream: &str) {
        self.fold_errors.get_or_create(&StreamLabels::new(stream, sharded_stream)).inc();
    }

    /// Records how long one fold-then-trim of `stream` took.
    pub fn fold_duration(&self, stream: &str, sharded_stream: &str, took: std::time::Duration) {
        self.fold_seconds.get_or_create(&StreamLabels::new(stream, sharded_stream)).observe(took.as_secs_f64());
    }

    /// Sets what the archive holds of `stream`.
    pub fn extent(&self, stream: &str, sharded_stream: &str, extent: ArchiveExtent) {
        let labels = StreamLabels::new(stream, sharded_stream);
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.files.get_or_create(&labels).set(gauge(extent.files));
        self.bytes.get_or_create(&labels).set(gauge(extent.bytes));
        self.entries.get_or_create(&labels).set(gauge(extent.entries));
        if let Some(ms) = extent.oldest_ms {
            self.oldest_seconds.get_or_create(&labels).set(ms as f64 / 1000.0);
        }
    }
}
