//! DescribeGroup: validate → one pipeline (XINFO GROUPS, XINFO CONSUMERS,
//! XPENDING summary, the oldest pending entries, XLEN) → the group's state.

use std::{collections::HashMap, time::Duration};

use redis::Value;

use super::Admin;
use crate::{
    error::Error,
    id::StreamId,
    proto::{ConsumerInfo, DescribeGroupRequest, DescribeGroupResponse},
    redis::{array, bytes, parse_stream_id, Redis},
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
        crate::stream::not_sharded(&admin.redis, "stream", stream).await?;
        return describe(&admin.redis, stream, &request.group, DELIVERY_COUNT_SCAN).await;
    };
    let mut shards = Vec::with_capacity(shard_keys.len());
    for key in &shard_keys {
        shards.push(describe(&admin.redis, key, &request.group, DELIVERY_COUNT_SCAN).await?);
    }
    Ok(sum_shards(stream, &request.group, shards))
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
        shards,
    }
}

/// A group's state, the highest delivery count taken over the oldest `scan`
/// pending entries. Also feeds the polled metrics.
///
/// Errors: [`Error::NotFound`] when the stream or group is missing;
/// [`Error::WrongType`]; [`Error::Unavailable`].
pub async fn describe(redis: &Redis, stream: &str, group: &str, scan: usize) -> Result<DescribeGroupResponse, Error> {
    let mut pipe = redis::pipe();
    pipe.cmd("XINFO").arg("GROUPS").arg(stream);
    pipe.cmd("XINFO").arg("CONSUMERS").arg(stream).arg(group);
    pipe.cmd("XPENDING").arg(stream).arg(group);
    pipe.cmd("XPENDING").arg(stream).arg(group).arg("-").arg("+").arg(scan);
    pipe.cmd("XLEN").arg(stream);
    let mut conn = redis.conn.clone();
    let replies: Vec<Value> = pipe.query_async(&mut conn).await.map_err(|e| {
        let text = e.to_string();
        if e.code() == Some("NOGROUP") || text.contains("no such key") || text.contains("NOGROUP") {
            Error::NotFound { what: format!("group `{group}` of stream `{stream}`") }
        } else {
            Error::from_redis(e, "describing the group", stream)
        }
    })?;
    let [groups, consumers, summary, oldest, length] =
        <[Value; 5]>::try_from(replies).map_err(|_| Error::invalid("group", "unexpected reply from Redis"))?;

    let info = array(&groups)
        .iter()
        .map(flat_map)
        .find(|info| info.get("name").and_then(text).as_deref() == Some(group))
        .ok_or_else(|| Error::NotFound { what: format!("group `{group}` of stream `{stream}`") })?;
    let consumers = array(&consumers)
        .iter()
        .map(flat_map)
        .map(|c| ConsumerInfo {
            name: c.get("name").and_then(text).unwrap_or_default(),
            pending: c.get("pending").and_then(int).unwrap_or(0),
            idle: Some(Duration::from_millis(c.get("idle").and_then(int).unwrap_or(0)).try_into().unwrap_or_default()),
        })
        .collect();
    let summary = array(&summary);
    let oldest_pending_id = summary.get(1).and_then(|v| parse_stream_id(v).ok());
    let max_delivery_count = array(&oldest).iter().filter_map(|e| array(e).get(3).and_then(int)).max().unwrap_or(0);
    let oldest_pending_age = oldest_pending_id.map(|id: StreamId| {
        Duration::from_millis(crate::entry::now_unix_ms().saturating_sub(id.ms)).try_into().unwrap_or_default()
    });
    Ok(DescribeGroupResponse {
        stream: stream.to_owned(),
        group: group.to_owned(),
        pending: summary.first().and_then(int).unwrap_or(0),
        // Redis reports nil when it cannot compute the lag (after deletions).
        lag: info.get("lag").and_then(int),
        last_delivered_id: info.get("last-delivered-id").and_then(text).unwrap_or_default(),
        consumers,
        oldest_pending_id: oldest_pending_id.map(|id| id.to_string()).unwrap_or_default(),
        oldest_pending_age,
        max_delivery_count,
        stream_length: int(&length).unwrap_or(0),
        shards: Vec::new(),
    })
}

/// A RESP2 flat `[name, value, name, value, …]` reply (or a RESP3 map) as a map.
fn flat_map(value: &Value) -> HashMap<String, Value> {
    match value {
        Value::Map(pairs) => pairs.iter().filter_map(|(k, v)| Some((text(k)?, v.clone()))).collect(),
        _ => array(value).chunks(2).filter_map(|pair| Some((text(&pair[0])?, pair.get(1)?.clone()))).collect(),
    }
}

fn text(value: &Value) -> Option<String> {
    bytes(value).ok().and_then(|b| String::from_utf8(b).ok())
}

fn int(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        other => text(other)?.parse().ok(),
    }
}
