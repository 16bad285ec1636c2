//! DescribeGroup: validate → one pipeline (XINFO GROUPS, XINFO CONSUMERS,
//! XPENDING summary, the oldest pending entries, XLEN), the schedule's size
//! and first due time (ZCARD, ZRANGE) → the group's state.

use std::time::Duration;

use super::Admin;
use crate::{
    error::Error,
    id::StreamId,
    proto::{ArchiveInfo, ConsumerInfo, DescribeGroupRequest, DescribeGroupResponse},
    redis::{group::group_state, Redis},
    security::Caller,
};

/// How many of the oldest pending entries are scanned for the highest delivery count.
const DELIVERY_COUNT_SCAN: usize = 10_000;

/// DescribeGroup.
pub(super) async fn describe_group(
    admin: &Admin,
    caller: Option<&Caller>,
    request: &DescribeGroupRequest,
) -> Result<DescribeGroupResponse, Error> {
    let stream = admin.guard.stream(caller, "stream", &request.stream)?;
    admin.guard.name("group", &request.group)?;
    let Some(shard_keys) = admin.redis.keys.shards(stream) else {
        // Sharded by other sidecars only: the logical name is no key here.
        admin.redis.refuse_sharded("stream", stream).await?;
        let state = describe(&admin.redis, stream, &request.group).await?;
        return Ok(DescribeGroupResponse { archive: archive_info(admin, stream).await, ..state });
    };
    let mut shards = Vec::with_capacity(shard_keys.len());
    for key in &shard_keys {
        let state = describe(&admin.redis, key, &request.group).await?;
        shards.push(DescribeGroupResponse { archive: archive_info(admin, key).await, ..state });
    }
    Ok(sum_shards(stream, &request.group, shards))
}

/// What the archive holds of stream key `stream`, and this sidecar's last
/// fold error; unset without an archive. A manifest that cannot be read is
/// reported in `last_error`, not as the call's error.
async fn archive_info(admin: &Admin, stream: &str) -> Option<ArchiveInfo> {
    let folding = admin.archive.as_deref()?;
    let manifest = match folding.archive().manifest(stream).await {
        Ok(manifest) => manifest,
        Err(e) => return Some(ArchiveInfo { last_error: format!("reading the manifest: {e}"), ..Default::default() }),
    };
    let id = |id: Option<StreamId>| id.map(|id| id.to_string()).unwrap_or_default();
    Some(ArchiveInfo {
        oldest_id: id(manifest.oldest()),
        archived_through: id(manifest.archived_through()),
        entries: manifest.entries(),
        files: manifest.files.len() as u64,
        bytes: manifest.bytes(),
        last_error: folding.last_error(stream).unwrap_or_default(),
    })
}

/// A sharded stream's state: the shards' states added up, each kept in `shards`.
fn sum_shards(stream: &str, group: &str, shards: Vec<DescribeGroupResponse>) -> DescribeGroupResponse {
    let mut consumers: Vec<ConsumerInfo> = Vec::new();
    for consumer in shards.iter().flat_map(|s| &s.consumers) {
        match consumers.iter_mut().find(|c| c.name == consumer.name) {
            Some(seen) => {
                seen.pending += consumer.pending;
                let shorter =
                    |a: &prost_types::Duration, b: &prost_types::Duration| (a.seconds, a.nanos) < (b.seconds, b.nanos);
                if let (Some(idle), Some(seen_idle)) = (&consumer.idle, &seen.idle) {
                    if shorter(idle, seen_idle) {
                        seen.idle = Some(*idle);
                    }
                }
            }
            None => consumers.push(consumer.clone()),
        }
    }
    let oldest = shards
        .iter()
        .filter_map(|s| Some((s.oldest_pending_id.parse::<StreamId>().ok()?, s)))
        .min_by_key(|(id, _)| *id)
        .map(|(_, s)| s);
    DescribeGroupResponse {
        stream: stream.to_owned(),
        group: group.to_owned(),
        pending: shards.iter().map(|s| s.pending).sum(),
        lag: shards.iter().map(|s| s.lag).sum(),
        last_delivered_id: String::new(),
        consumers,
        oldest_pending_id: oldest.map(|s| s.oldest_pending_id.clone()).unwrap_or_default(),
        oldest_pending_age: oldest.and_then(|s| s.oldest_pending_age),
        max_delivery_count: shards.iter().map(|s| s.max_delivery_count).max().unwrap_or(0),
        stream_length: shards.iter().map(|s| s.stream_length).sum(),
        scheduled: shards.iter().map(|s| s.scheduled).sum(),
        oldest_scheduled_due: shards
            .iter()
            .filter_map(|s| s.oldest_scheduled_due)
            .min_by_key(|due| (due.seconds, due.nanos)),
        keyed_entries: 0,
        busy_keys: Vec::new(),
        shards,
        archive: None,
    }
}

/// One stream key's group state, as the wire shows it.
async fn describe(redis: &Redis, stream: &str, group: &str) -> Result<DescribeGroupResponse, Error> {
    let state = group_state(redis, stream, group, DELIVERY_COUNT_SCAN).await?;
    let (scheduled, oldest_scheduled_due) = crate::stream::scheduled::summary(redis, stream).await?;
    let duration = |d: Duration| prost_types::Duration::try_from(d).unwrap_or_default();
    Ok(DescribeGroupResponse {
        stream: stream.to_owned(),
        group: group.to_owned(),
        pending: state.pending,
        lag: state.lag,
        last_delivered_id: state.last_delivered_id,
        consumers: state
            .consumers
            .into_iter()
            .map(|c| ConsumerInfo { name: c.name, pending: c.pending, idle: Some(duration(c.idle)) })
            .collect(),
        oldest_pending_id: state.oldest_pending_id.map(|id| id.to_string()).unwrap_or_default(),
        oldest_pending_age: state.oldest_pending_age.map(duration),
        max_delivery_count: state.max_delivery_count,
        stream_length: state.stream_length,
        scheduled,
        oldest_scheduled_due: oldest_scheduled_due.map(crate::entry::timestamp),
        shards: Vec::new(),
        archive: None,
        keyed_entries: 0,
        busy_keys: Vec::new(),
    })
}
