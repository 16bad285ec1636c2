//! Metrics polling: the group's state, read as DescribeGroup reads it, into
//! the polled gauges (`echomq_group_pending`, lag, the oldest pending entry's
//! age, the highest delivery count, consumers, stream length, scheduled
//! entries and the earliest one's due time).

use super::GroupKeys;
use crate::metrics::GroupMetrics;

/// Pending entries scanned for the highest delivery count.
const PENDING_SCAN: usize = 1_000;

/// Reads the group's state and sets the gauges; a failure is logged at debug
/// and leaves them as they were (the next poll tries again).
pub(crate) async fn poll(keys: &GroupKeys, metrics: &GroupMetrics) {
    match crate::redis::group::group_state(&keys.redis, &keys.stream, &keys.group, PENDING_SCAN).await {
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
    match crate::stream::scheduled::summary(&keys.redis, &keys.stream).await {
        Ok((count, due)) => {
            metrics.scheduled.set(count as i64);
            metrics.scheduled_oldest_due.set(due.map_or(0.0, |ms| ms as f64 / 1000.0));
        }
        Err(e) => tracing::debug!(stream = %keys.stream, "polling the stream's schedule failed: {e}"),
    }
}
