//! DescribeGroup: validate → one script (`group_state.lua`: XINFO GROUPS,
//! XINFO CONSUMERS, XPENDING summary, the oldest pending entries, XLEN, the
//! lag; the schedule's size and first due time, ZCARD, ZRANGE), the keyed
//! entries of per-key limits (ZCARD, ZRANGEBYLEX, an XPENDING per busy key's
//! head) → the group's state.

use std::time::Duration;

use super::Admin;
use crate::{
    consume::keyed,
    error::Error,
    id::StreamId,
    proto::{ArchiveInfo, BusyKey, ConsumerInfo, DescribeGroupRequest, DescribeGroupResponse},
    redis::Redis,
    security::Caller,
};

/// How many of the oldest pending entries are scanned for the highest delivery count.
const DELIVERY_COUNT_SCAN: usize = 10_000;
/// How many keyed entries (members of `<stream>:keys:<group>`) are scanned for busy keys.
const KEYED_SCAN: usize = 10_000;
/// The most busy keys shown.
const BUSY_KEYS_SHOWN: usize = 100;

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
    let read = crate::redis::group::state(redis, stream, group, DELIVERY_COUNT_SCAN).await?;
    let state = read.group?;
    let scheduled = read.scheduled?;
    let (keyed_entries, busy_keys) = busy_keys(redis, stream, group).await?;
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
        scheduled: scheduled.count,
        oldest_scheduled_due: scheduled.first_due_ms.map(crate::entry::timestamp),
        shards: Vec::new(),
        archive: None,
        keyed_entries,
        busy_keys,
    })
}

/// The group's keyed entries (per-key limits: `ZCARD` of
/// `<stream>:keys:<group>`) and its busiest keys: the first [`KEYED_SCAN`]
/// members (`ZRANGEBYLEX - + LIMIT`), grouped by key, the [`BUSY_KEYS_SHOWN`]
/// with most entries first, each with its head (its first member's stream
/// id) and the consumer whose PEL holds that (`XPENDING <stream> <group>
/// <head> <head> 1`; empty when no consumer has it pending: the next gate
/// run removes it). Both zero and empty for a group without a key field.
///
/// Errors: Redis' (WRONGTYPE when the key holds another type).
async fn busy_keys(redis: &Redis, stream: &str, group: &str) -> Result<(u64, Vec<BusyKey>), Error> {
    let zset = redis.keys.keys(stream, group);
    let mut conn = redis.conn.clone();
    let doing = "reading the group's keyed entries (ZCARD, ZRANGEBYLEX)";
    let (count, members): (u64, Vec<Vec<u8>>) = redis::pipe()
        .cmd("ZCARD")
        .arg(&zset)
        .cmd("ZRANGEBYLEX")
        .arg(&zset)
        .arg("-")
        .arg("+")
        .arg("LIMIT")
        .arg(0)
        .arg(KEYED_SCAN)
        .query_async(&mut conn)
        .await
        .map_err(|e| Error::from_redis(e, doing, stream))?;
    let mut busy = group_by_key(&members);
    busy.truncate(BUSY_KEYS_SHOWN);
    if busy.is_empty() {
        return Ok((count, busy));
    }
    let mut pipe = redis::pipe();
    for key in &busy {
        pipe.cmd("XPENDING").arg(stream).arg(group).arg(&key.head_id).arg(&key.head_id).arg(1);
    }
    let heads: Vec<redis::Value> = pipe
        .query_async(&mut conn)
        .await
        .map_err(|e| Error::from_redis(e, "reading the busy keys' heads (XPENDING)", stream))?;
    for (key, head) in busy.iter_mut().zip(heads) {
        let owner = crate::redis::array(&head).first().map(crate::redis::array).and_then(|entry| entry.get(1).cloned());
        key.head_consumer = owner
            .and_then(|name| crate::redis::bytes(&name).ok())
            .map_or_else(String::new, |name| String::from_utf8_lossy(&name).into_owned());
    }
    Ok((count, busy))
}

/// Keyed members (in set order: by key, each key's in stream order) grouped
/// by key, most entries first (ties in key order); the head of each is its
/// first member. Members not shaped as the sidecar writes them are skipped.
fn group_by_key(members: &[Vec<u8>]) -> Vec<BusyKey> {
    let mut keys: Vec<BusyKey> = Vec::new();
    for (key, id) in members.iter().filter_map(|member| keyed::parse_member(member)) {
        match keys.last_mut() {
            Some(last) if last.key == key => last.entries += 1,
            _ => keys.push(BusyKey {
                key: key.to_vec(),
                entries: 1,
                head_id: id.to_string(),
                head_consumer: String::new(),
            }),
        }
    }
    keys.sort_by_key(|key| std::cmp::Reverse(key.entries));
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_keys_are_grouped_by_key_busiest_first_with_their_heads() {
        let id = |ms| StreamId { ms, seq: 0 };
        let members = [
            keyed::member(b"a", id(5)),
            keyed::member(b"b", id(1)),
            keyed::member(b"b", id(2)),
            keyed::member(b"b:x", id(3)),
            b"hand-written".to_vec(),
        ];
        let mut sorted = members.to_vec();
        sorted.sort();
        let busy = group_by_key(&sorted);
        let seen: Vec<(&[u8], u64, &str)> =
            busy.iter().map(|k| (k.key.as_slice(), k.entries, k.head_id.as_str())).collect();
        assert_eq!(seen, [(&b"b"[..], 2, "1-0"), (&b"a"[..], 1, "5-0"), (&b"b:x"[..], 1, "3-0")]);
    }
}
