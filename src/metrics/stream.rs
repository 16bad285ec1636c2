//! Per-stream series of the StreamService (`echomq_appends_total`,
//! `echomq_trimmed_unread_total`): declared and registered once, in
//! [`StreamMetrics::register`]. Adding one touches this file only (and the docs).

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use super::{group::GroupLabels, registered};

/// Labels of per-stream series (appends): the stream key, and the stream as
/// appended to (a sharded stream's name), as in [`GroupLabels`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    /// The stream key written (a shard's key, for a sharded stream).
    pub stream: String,
    /// The stream as named in the call: a sharded stream's name, else the key again.
    pub sharded_stream: String,
}

impl StreamLabels {
    /// The labels of `stream` (a shard of `sharded_stream`, or the stream again).
    pub fn new(stream: &str, sharded_stream: &str) -> StreamLabels {
        StreamLabels { stream: stream.to_owned(), sharded_stream: sharded_stream.to_owned() }
    }
}

/// The StreamService's series. Cheap to clone.
#[derive(Clone)]
pub struct StreamMetrics {
    appends: Family<StreamLabels, Counter>,
    trimmed_unread: Family<GroupLabels, Counter>,
}

impl StreamMetrics {
    /// Creates the series and registers them in `r` (the `echomq_` registry).
    pub fn register(r: &mut Registry) -> StreamMetrics {
        StreamMetrics {
            appends: registered(
                r,
                "appends",
                "Entries appended (Append, AppendBatch), counted once Redis confirmed",
                Family::default(),
            ),
            trimmed_unread: registered(
                r,
                "trimmed_unread",
                "Entries a trim removed (Trim with ignore_groups, an Append's max_len) before the group was delivered them",
                Family::default(),
            ),
        }
    }

    /// Creates (at zero) the series of a subscribed group's stream, so
    /// `rate()` over it needs no first append or trim.
    pub(super) fn subscribed(&self, group: &GroupLabels) {
        let _ = self.trimmed_unread.get_or_create(group);
        let _ = self.appends.get_or_create(&StreamLabels::new(&group.stream, &group.sharded_stream));
    }

    /// Undoes [`StreamMetrics::subscribed`] for a group no worker here
    /// serves any more: its series still at zero go (one with a value stays,
    /// as an unsubscribed stream's do), the stream's only when `stream_served`
    /// is false (no other group of it is served here).
    pub(super) fn unsubscribed(&self, group: &GroupLabels, stream_served: bool) {
        remove_if_zero(&self.trimmed_unread, group);
        if !stream_served {
            remove_if_zero(&self.appends, &StreamLabels::new(&group.stream, &group.sharded_stream));
        }
    }

    /// Counts `entries` appended to `stream` (a sharded stream's shard key:
    /// `sharded_stream` names the sharded stream), once Redis confirmed them.
    pub fn appended(&self, stream: &str, sharded_stream: &str, entries: usize) {
        self.appends.get_or_create(&StreamLabels::new(stream, sharded_stream)).inc_by(entries as u64);
    }

    /// Counts `entries` of `stream` removed by a trim before `group` was
    /// delivered them (`echomq_trimmed_unread_total`).
    pub fn trimmed_unread(&self, stream: &str, sharded_stream: &str, group: &str, entries: u64) {
        self.trimmed_unread.get_or_create(&GroupLabels::new(stream, sharded_stream, group)).inc_by(entries);
    }
}

/// Removes the series of `labels` if it is at zero. A count landing between
/// the look and the removal is lost with it: only at a group's retirement,
/// and only for a series that had counted nothing.
fn remove_if_zero<S: Clone + std::hash::Hash + Eq>(family: &Family<S, Counter>, labels: &S) {
    let zero = family.get(labels).is_some_and(|counter| counter.get() == 0);
    if zero {
        family.remove(labels);
    }
}
