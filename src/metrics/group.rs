//! Per-group series (`echomq_deliveries_total`, `echomq_group_pending`, …,
//! labelled by stream and group): each family declared and registered once,
//! in `GroupFamilies::register`, and [`GroupMetrics`], one group's
//! handles. Adding a per-group metric touches this file only (and the docs).

use std::sync::Arc;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::registered;
use crate::{proto::VerdictErrorCode, redis::timed::latency_histogram};

/// Labels of per-group series. The values are shared (`Arc`): one group's
/// labels key a series in each of some thirty families, and 1,000
/// subscriptions held each value thirty times over (about 4 MB).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabels {
    /// The stream key (a shard's key, for a sharded stream).
    pub stream: Arc<String>,
    /// The stream as subscribed: a sharded stream's name, else the stream
    /// key again; `sum by (sharded_stream, group)` adds up a sharded stream.
    pub sharded_stream: Arc<String>,
    /// The consumer group.
    pub group: Arc<String>,
}

impl GroupLabels {
    /// The labels of `group` on `stream` (a shard of `sharded_stream`, or the stream again).
    pub fn new(stream: &str, sharded_stream: &str, group: &str) -> GroupLabels {
        let stream = Arc::new(stream.to_owned());
        let sharded_stream =
            if sharded_stream == stream.as_str() { Arc::clone(&stream) } else { Arc::new(sharded_stream.to_owned()) };
        GroupLabels { stream, sharded_stream, group: Arc::new(group.to_owned()) }
    }
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

type GroupCounter = Family<GroupLabels, Counter>;
type GroupGauge = Family<GroupLabels, Gauge>;
type GroupGaugeF64 = Family<GroupLabels, Gauge<f64, std::sync::atomic::AtomicU64>>;

/// Every group's series, one family per metric; the names and help texts
/// are in [`GroupFamilies::register`], the one place each is declared.
pub(super) struct GroupFamilies {
    deliveries: GroupCounter,
    acks: GroupCounter,
    fails: GroupCounter,
    transient_fails: GroupCounter,
    poison_fails: GroupCounter,
    window_stalls: GroupCounter,
    releases: GroupCounter,
    dead_letters: GroupCounter,
    reclaimed: GroupCounter,
    lease_refreshes: GroupCounter,
    leases_lost: GroupCounter,
    acks_not_pending: GroupCounter,
    emits: GroupCounter,
    trimmed_while_pending: GroupCounter,
    group_recreations: GroupCounter,
    key_gate_checks: GroupCounter,
    verdict_errors: Family<CodeLabels, Counter>,
    consume_calls: GroupGauge,
    in_flight: GroupGauge,
    key_waiting_entries: GroupGauge,
    group_sidecars: GroupGauge,
    reader_blocking: GroupGauge,
    handler_seconds: Family<GroupLabels, Histogram>,
    pending: GroupGauge,
    lag: GroupGauge,
    oldest_pending_age_seconds: GroupGaugeF64,
    max_delivery_count: GroupGauge,
    consumers: GroupGauge,
    stream_length: GroupGauge,
    scheduled: GroupGauge,
    scheduled_oldest_due: GroupGaugeF64,
    redis_errors: Family<OperationLabels, Counter>,
}

impl GroupFamilies {
    /// Creates the families and registers them in `r` (the `echomq_` registry).
    pub(super) fn register(r: &mut Registry) -> GroupFamilies {
        GroupFamilies {
            deliveries: registered(
                r,
                "deliveries",
                "Entries handed to clients (each hand-over counts)",
                Family::default(),
            ),
            acks: registered(r, "acks", "Entries acknowledged (XACK found them pending)", Family::default()),
            fails: registered(
                r,
                "fails",
                "Fail verdicts, deadlines passed and calls ended holding entries",
                Family::default(),
            ),
            transient_fails: registered(
                r,
                "transient_fails",
                "Fail verdicts of kind TRANSIENT, re-delivered without counting an attempt (also in fails)",
                Family::default(),
            ),
            window_stalls: registered(
                r,
                "window_stalls",
                "calls of an adaptive window that held all of it and settled nothing for its stall time: \
                 the window opened, held, or was at its cap",
                Family::default(),
            ),
            poison_fails: registered(
                r,
                "poison_fails",
                "Fail verdicts of kind POISON, dead-lettered at once (also in fails and dead_letters)",
                Family::default(),
            ),
            releases: registered(
                r,
                "releases",
                "Deliveries a client released unstarted, given back to the group with their delivery count restored",
                Family::default(),
            ),
            dead_letters: registered(r, "dead_letters", "Entries moved to a dead-letter stream", Family::default()),
            reclaimed: registered(
                r,
                "reclaimed",
                "Entries taken over from idle consumers (XAUTOCLAIM)",
                Family::default(),
            ),
            lease_refreshes: registered(
                r,
                "lease_refreshes",
                "Held entries whose PEL idle time was refreshed",
                Family::default(),
            ),
            leases_lost: registered(
                r,
                "leases_lost",
                "Held entries a peer reclaimed before their verdict",
                Family::default(),
            ),
            acks_not_pending: registered(
                r,
                "acks_not_pending",
                "Acks XACK found no longer pending (nothing applied)",
                Family::default(),
            ),
            emits: registered(
                r,
                "emits",
                "Entries appended by AckEmit verdicts, each with the XACK of its source entry",
                Family::default(),
            ),
            trimmed_while_pending: registered(
                r,
                "trimmed_while_pending",
                "Pending entries found deleted from their stream and dropped from the PEL",
                Family::default(),
            ),
            group_recreations: registered(
                r,
                "group_recreations",
                "Groups re-created after NOGROUP (an expected recovery, not counted as a Redis error)",
                Family::default(),
            ),
            key_gate_checks: registered(
                r,
                "key_gate_checks",
                "Entries put through the per-key gate (Subscribe.key_field): on read, on re-delivery and while waiting for their key",
                Family::default(),
            ),
            verdict_errors: registered(
                r,
                "verdict_errors",
                "Verdicts answered with a VerdictError and not applied, by code",
                Family::default(),
            ),
            consume_calls: registered(
                r,
                "consume_calls",
                "Consume calls attached to the group now (open)",
                Family::default(),
            ),
            in_flight: registered(
                r,
                "in_flight",
                "Deliveries held by clients, waiting for a verdict",
                Family::default(),
            ),
            key_waiting_entries: registered(
                r,
                "key_waiting_entries",
                "Entries this sidecar holds pending for the group that wait for their key (per-key limits), handed to no call",
                Family::default(),
            ),
            group_sidecars: registered(
                r,
                "group_sidecars",
                "Sidecars serving the group, by their heartbeats within three of this sidecar's hygiene beats (30 s unless --consumer-idle-limit-ms is short; this one included), at its last beat",
                Family::default(),
            ),
            reader_blocking: registered(
                r,
                "reader_blocking",
                "1 while this sidecar's reader of the group blocks on a connection of its own (XREADGROUP BLOCK), 0 while it shares or there is none (--shared-readers)",
                Family::default(),
            ),
            handler_seconds: registered(
                r,
                "handler_duration_seconds",
                "Time from delivery to verdict",
                Family::new_with_constructor(latency_histogram),
            ),
            pending: registered(r, "group_pending", "Entries in the group's PEL (polled)", Family::default()),
            lag: registered(
                r,
                "group_lag",
                "Entries not yet read by the group (polled; absent when unknown)",
                Family::default(),
            ),
            oldest_pending_age_seconds: registered(
                r,
                "group_oldest_pending_age_seconds",
                "Age of the group's oldest pending entry (polled)",
                Family::default(),
            ),
            max_delivery_count: registered(
                r,
                "group_max_delivery_count",
                "Highest delivery count among the oldest pending entries (polled)",
                Family::default(),
            ),
            consumers: registered(r, "group_consumers", "Consumers in the group (polled)", Family::default()),
            stream_length: registered(r, "stream_length", "Entries in the stream (polled)", Family::default()),
            scheduled: registered(
                r,
                "scheduled",
                "Scheduled entries (Append's deliver_at/delay) not yet in the stream (polled)",
                Family::default(),
            ),
            scheduled_oldest_due: registered(
                r,
                "scheduled_oldest_due_timestamp_seconds",
                "When the earliest scheduled entry not yet in the stream is due, unix seconds; 0 when none (polled)",
                Family::default(),
            ),
            redis_errors: registered(
                r,
                "redis_errors",
                "Failed Redis steps of group workers, by group and operation (NOGROUP, recovered, is not one)",
                Family::default(),
            ),
        }
    }

    /// The handles of `labels`' series, every one created (at zero) now.
    pub(super) fn handles(&self, labels: GroupLabels) -> GroupMetrics {
        GroupMetrics {
            deliveries: self.deliveries.get_or_create(&labels).clone(),
            acks: self.acks.get_or_create(&labels).clone(),
            fails: self.fails.get_or_create(&labels).clone(),
            transient_fails: self.transient_fails.get_or_create(&labels).clone(),
            poison_fails: self.poison_fails.get_or_create(&labels).clone(),
            window_stalls: self.window_stalls.get_or_create(&labels).clone(),
            releases: self.releases.get_or_create(&labels).clone(),
            dead_letters: self.dead_letters.get_or_create(&labels).clone(),
            reclaimed: self.reclaimed.get_or_create(&labels).clone(),
            lease_refreshes: self.lease_refreshes.get_or_create(&labels).clone(),
            leases_lost: self.leases_lost.get_or_create(&labels).clone(),
            acks_not_pending: self.acks_not_pending.get_or_create(&labels).clone(),
            emits: self.emits.get_or_create(&labels).clone(),
            trimmed_while_pending: self.trimmed_while_pending.get_or_create(&labels).clone(),
            group_recreations: self.group_recreations.get_or_create(&labels).clone(),
            key_gate_checks: self.key_gate_checks.get_or_create(&labels).clone(),
            verdict_errors: self.verdict_errors(&labels),
            consume_calls: self.consume_calls.get_or_create(&labels).clone(),
            in_flight: self.in_flight.get_or_create(&labels).clone(),
            key_waiting_entries: self.key_waiting_entries.get_or_create(&labels).clone(),
            group_sidecars: self.group_sidecars.get_or_create(&labels).clone(),
            reader_blocking: self.reader_blocking.get_or_create(&labels).clone(),
            handler_seconds: self.handler_seconds.get_or_create(&labels).clone(),
            pending: self.pending.get_or_create(&labels).clone(),
            oldest_pending_age_seconds: self.oldest_pending_age_seconds.get_or_create(&labels).clone(),
            max_delivery_count: self.max_delivery_count.get_or_create(&labels).clone(),
            consumers: self.consumers.get_or_create(&labels).clone(),
            stream_length: self.stream_length.get_or_create(&labels).clone(),
            scheduled: self.scheduled.get_or_create(&labels).clone(),
            scheduled_oldest_due: self.scheduled_oldest_due.get_or_create(&labels).clone(),
            lag_family: self.lag.clone(),
            redis_errors_family: self.redis_errors.clone(),
            labels,
        }
    }

    /// `labels`' verdict error counters, every code's created (at zero) now.
    /// Removes every series of `labels` (with `operations`, the
    /// `redis_errors` operations its handles created): the group's worker
    /// retired, and a series it no longer updates would be a stale gauge
    /// (a lag that alerts forever) and memory kept for a group gone.
    pub(super) fn remove(&self, labels: &GroupLabels, operations: &[&'static str]) {
        for family in [
            &self.deliveries,
            &self.acks,
            &self.fails,
            &self.transient_fails,
            &self.poison_fails,
            &self.window_stalls,
            &self.releases,
            &self.dead_letters,
            &self.reclaimed,
            &self.lease_refreshes,
            &self.leases_lost,
            &self.acks_not_pending,
            &self.emits,
            &self.trimmed_while_pending,
            &self.group_recreations,
            &self.key_gate_checks,
        ] {
            family.remove(labels);
        }
        for family in [
            &self.consume_calls,
            &self.in_flight,
            &self.key_waiting_entries,
            &self.group_sidecars,
            &self.reader_blocking,
            &self.pending,
            &self.lag,
            &self.max_delivery_count,
            &self.consumers,
            &self.stream_length,
            &self.scheduled,
        ] {
            family.remove(labels);
        }
        self.oldest_pending_age_seconds.remove(labels);
        self.scheduled_oldest_due.remove(labels);
        self.handler_seconds.remove(labels);
        for (_, code) in VerdictErrors::CODES {
            self.verdict_errors.remove(&CodeLabels { group: labels.clone(), code });
        }
        for &operation in operations {
            self.redis_errors.remove(&OperationLabels { group: labels.clone(), operation });
        }
    }

    pub(super) fn verdict_errors(&self, labels: &GroupLabels) -> VerdictErrors {
        VerdictErrors::new(&self.verdict_errors, labels)
    }
}

/// One group's series (see [`super::Metrics::group`]). Cheap to clone: every handle
/// is an `Arc` around an atomic, so the hot path never hashes labels.
#[derive(Clone)]
pub struct GroupMetrics {
    /// `echomq_deliveries_total`: hand-overs to clients (entries).
    pub deliveries: Counter,
    /// `echomq_acks_total`: entries XACK confirmed (entries).
    pub acks: Counter,
    /// `echomq_fails_total`: Fail verdicts, passed deadlines, calls ended holding entries.
    pub fails: Counter,
    /// `echomq_transient_fails_total`: the Fails of kind TRANSIENT among those.
    pub transient_fails: Counter,
    /// `echomq_poison_fails_total`: the Fails of kind POISON among those.
    pub poison_fails: Counter,
    /// `echomq_window_stalls_total`: stalls of calls' adaptive windows
    /// (see `consume::window`).
    pub window_stalls: Counter,
    /// `echomq_releases_total`: deliveries released unstarted, as Redis confirmed (entries).
    pub releases: Counter,
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
    /// `echomq_emits_total`: entries appended by AckEmits (entries).
    pub emits: Counter,
    /// `echomq_trimmed_while_pending_total`: pending entries found deleted.
    pub trimmed_while_pending: Counter,
    /// `echomq_group_recreations_total`: groups re-created after NOGROUP.
    pub group_recreations: Counter,
    /// `echomq_key_gate_checks_total`: entries put through the per-key gate.
    pub key_gate_checks: Counter,
    /// `echomq_verdict_errors_total{code}`: verdicts answered with a VerdictError.
    pub verdict_errors: VerdictErrors,
    /// `echomq_consume_calls`: Consume calls attached to this group's worker now.
    pub consume_calls: Gauge,
    /// `echomq_in_flight`: deliveries held by calls now (entries).
    pub in_flight: Gauge,
    /// `echomq_key_waiting_entries`: entries this sidecar holds waiting for
    /// their key (per-key limits), handed to no call (entries).
    pub key_waiting_entries: Gauge,
    /// `echomq_group_sidecars`: sidecars serving the group by their fresh
    /// heartbeats (this one included), at the last hygiene beat.
    pub group_sidecars: Gauge,
    /// `echomq_reader_blocking`: 1 while this sidecar's reader of the group
    /// blocks on a connection of its own, 0 while it shares or there is none.
    pub reader_blocking: Gauge,
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
    /// `echomq_scheduled` (polled, entries): scheduled entries not yet in the stream.
    pub scheduled: Gauge,
    /// `echomq_scheduled_oldest_due_timestamp_seconds` (polled, unix seconds; 0: none).
    pub scheduled_oldest_due: Gauge<f64, std::sync::atomic::AtomicU64>,
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
    counters: [Counter; 6],
}

impl VerdictErrors {
    /// Every code a verdict error carries, as its `code` label: the
    /// `VerdictErrorCode` name without its prefix, in snake_case.
    pub const CODES: [(VerdictErrorCode, &'static str); 6] = [
        (VerdictErrorCode::UnknownId, "unknown_id"),
        (VerdictErrorCode::NotPending, "not_pending"),
        (VerdictErrorCode::InvalidArgument, "invalid_argument"),
        (VerdictErrorCode::Unavailable, "unavailable"),
        (VerdictErrorCode::LeaseLost, "lease_lost"),
        (VerdictErrorCode::PermissionDenied, "permission_denied"),
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
