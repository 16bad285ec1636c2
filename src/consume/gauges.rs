//! Metrics polling: the group's state and its stream's schedule, read as
//! DescribeGroup reads them (one script round trip a poll), into
//! the polled gauges (`echomq_group_pending`, lag, the oldest pending entry's
//! age, the highest delivery count, consumers, stream length, scheduled
//! entries and the earliest one's due time).

use super::GroupKeys;
use crate::metrics::GroupMetrics;

/// Pending entries scanned for the highest delivery count.
const PENDING_SCAN: usize = 1_000;

/// Reads the group's state and the stream's schedule (one script round trip:
/// [`crate::redis::group::state`]) and sets the gauges; a failure is logged
/// at debug and leaves the gauges of the part that failed (the group's, the
/// schedule's, or both) as they were: the next poll tries again.
pub(crate) async fn poll(keys: &GroupKeys, metrics: &GroupMetrics) {
    let (group, scheduled) =
        match crate::redis::group::state(&keys.redis, &keys.stream, &keys.group, PENDING_SCAN).await {
            Ok(state) => (state.group, state.scheduled),
            Err(e) => {
                tracing::debug!(stream = %keys.stream, group = %keys.group, "polling the group's state failed: {e}");
                return;
            }
        };
    match group {
        Ok(state) => {
            metrics.pending.set(state.pending as i64);
            metrics.set_lag(state.lag);
            metrics.oldest_pending_age_seconds.set(state.oldest_pending_age.map_or(0.0, |age| age.as_secs_f64()));
            metrics.max_delivery_count.set(state.max_delivery_count as i64);
            metrics.consumers.set(state.consumers.len() as i64);
            metrics.stream_length.set(state.stream_length as i64);
        }
        Err(e) => tracing::debug!(stream = %keys.stream, group = %keys.group, "polling the group's state failed: {e}"),
    }
    match scheduled {
        Ok(scheduled) => {
            metrics.scheduled.set(scheduled.count as i64);
            metrics.scheduled_oldest_due.set(scheduled.first_due_ms.map_or(0.0, |ms| ms as f64 / 1000.0));
        }
        Err(e) => tracing::debug!(stream = %keys.stream, "polling the stream's schedule failed: {e}"),
    }
}
