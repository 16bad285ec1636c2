//! A consumer group's state as Redis reports it, read in one pipeline:
//! DescribeGroup and the consume path's polled gauges both read it here.
//! And a group's backlog, the work no call is doing (the KEDA scaler's metric).

use std::{collections::HashMap, time::Duration};

use redis::Value;

use super::{
    connect::Redis,
    fault::{fault, Fault},
    reply::{array, bytes, parse_stream_id},
};
use crate::{error::Error, id::StreamId};

/// One group's state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupState {
    /// Entries in the PEL (XPENDING summary).
    pub pending: u64,
    /// Entries in the stream after the group's last-delivered id
    /// (`group_lag.lua`); `None` where that cannot be known cheaply (see
    /// [`group_lag`]). Never XINFO's figure where Redis miscounts it.
    pub lag: Option<u64>,
    /// The group's last-delivered id (empty on a server that does not say).
    pub last_delivered_id: String,
    /// The group's consumers.
    pub consumers: Vec<ConsumerState>,
    /// The oldest pending entry, if any.
    pub oldest_pending_id: Option<StreamId>,
    /// Its age by its id's milliseconds against this host's clock.
    pub oldest_pending_age: Option<Duration>,
    /// The highest delivery count among the oldest pending entries scanned.
    pub max_delivery_count: u64,
    /// The stream's length (XLEN, entries).
    pub stream_length: u64,
}

/// One consumer of a group (`XINFO CONSUMERS`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumerState {
    /// Its name.
    pub name: String,
    /// Entries in its PEL.
    pub pending: u64,
    /// Since it last did something Redis counts as activity.
    pub idle: Duration,
}

/// `group`'s state on `stream`, the highest delivery count taken over the
/// oldest `scan` pending entries: one pipeline of XINFO GROUPS, XINFO
/// CONSUMERS, XPENDING (summary and the oldest `scan`), XLEN.
///
/// Errors: [`Error::NotFound`] when the stream or group is missing;
/// [`Error::WrongType`]; [`Error::Unavailable`].
pub async fn group_state(redis: &Redis, stream: &str, group: &str, scan: usize) -> Result<GroupState, Error> {
    let mut pipe = redis::pipe();
    pipe.cmd("XINFO").arg("GROUPS").arg(stream);
    pipe.cmd("XINFO").arg("CONSUMERS").arg(stream).arg(group);
    pipe.cmd("XPENDING").arg(stream).arg(group);
    pipe.cmd("XPENDING").arg(stream).arg(group).arg("-").arg("+").arg(scan);
    pipe.cmd("XLEN").arg(stream);
    let mut conn = redis.conn.clone();
    let not_found = || Error::NotFound { what: format!("group `{group}` of stream `{stream}`") };
    let replies: Vec<Value> = pipe.query_async(&mut conn).await.map_err(|e| match fault(&e) {
        Fault::NoGroup | Fault::NoSuchKey => not_found(),
        _ => Error::from_redis(e, "describing the group", stream),
    })?;
    let [groups, consumers, summary, oldest, length] =
        <[Value; 5]>::try_from(replies).map_err(|_| Error::invalid("group", "unexpected reply from Redis"))?;

    let info = array(&groups)
        .iter()
        .map(flat_map)
        .find(|info| info.get("name").and_then(text).as_deref() == Some(group))
        .ok_or_else(not_found)?;
    let consumers = array(&consumers)
        .iter()
        .map(flat_map)
        .map(|c| ConsumerState {
            name: c.get("name").and_then(text).unwrap_or_default(),
            pending: c.get("pending").and_then(int).unwrap_or(0),
            idle: Duration::from_millis(c.get("idle").and_then(int).unwrap_or(0)),
        })
        .collect();
    let summary = array(&summary);
    let oldest_pending_id = summary.get(1).and_then(|v| parse_stream_id(v).ok());
    Ok(GroupState {
        pending: summary.first().and_then(int).unwrap_or(0),
        lag: group_lag(redis, stream, group, LAG_COUNT_LIMIT).await?,
        last_delivered_id: info.get("last-delivered-id").and_then(text).unwrap_or_default(),
        consumers,
        oldest_pending_id,
        oldest_pending_age: oldest_pending_id
            .map(|id| Duration::from_millis(crate::entry::now_unix_ms().saturating_sub(id.ms))),
        max_delivery_count: array(&oldest).iter().filter_map(|e| array(e).get(3).and_then(int)).max().unwrap_or(0),
        stream_length: int(&length).unwrap_or(0),
    })
}

/// The most entries [`group_state`]'s lag counts one by one (XRANGE) where
/// Redis' own figure cannot be trusted.
const LAG_COUNT_LIMIT: usize = 100;

/// `group`'s lag on `stream` (`group_lag.lua`): the entries after its
/// last-delivered id. Exact when the group has read everything (0) or
/// nothing still in the stream (the length); Redis' XINFO `lag` on 7.2 and
/// later, and on 7.0/7.1 while nothing was ever removed from the stream;
/// otherwise counted up to `limit` entries, and `None` beyond: Redis 7.0
/// miscounts `lag` for good after a trim removed entries the group had not
/// read, and 6.2 has none.
///
/// Errors: [`Error::NotFound`] when the stream or the group is missing;
/// [`Error::Unavailable`].
pub async fn group_lag(redis: &Redis, stream: &str, group: &str, limit: usize) -> Result<Option<u64>, Error> {
    let mut conn = redis.conn.clone();
    let lag: Option<u64> =
        redis.scripts.group_lag.key(stream).arg(group).arg(limit).invoke_async(&mut conn).await.map_err(
            |e| match fault(&e) {
                Fault::NoGroup | Fault::NoSuchKey => {
                    Error::NotFound { what: format!("group `{group}` of stream `{stream}`") }
                }
                _ => Error::from_redis(e, "reading the group's lag", stream),
            },
        )?;
    Ok(lag)
}

/// A group's backlog: the entries waiting for a consumer that no call is
/// working on (see [`backlog`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backlog {
    /// The entries (lag + pending entries no live call holds), or a floor of
    /// them when `at_least`.
    pub entries: u64,
    /// More than the limit [`backlog`] was given were there to count one by
    /// one: `entries` is limit + 1 for that part, a floor, not the count.
    pub at_least: bool,
}

impl std::ops::Add for Backlog {
    type Output = Backlog;

    fn add(self, other: Backlog) -> Backlog {
        Backlog { entries: self.entries + other.entries, at_least: self.at_least || other.at_least }
    }
}

/// `group`'s backlog on `stream`: its lag ([`group_lag`], what DescribeGroup
/// reports as `lag`, right after trims on every server) plus the pending
/// entries idle for at least `unheld_after`. A call that holds an entry keeps
/// its PEL idle time fresh (the lease refresh, every third of
/// `--reclaim-min-idle-ms`), so an entry idle that long is held by no live
/// call: its consumer died, or its call went away; it is what a reclaim takes
/// over. Pass `--reclaim-min-idle-ms` as `unheld_after`.
///
/// Each part is exact up to `limit` entries; beyond, it counts as `limit + 1`
/// and `at_least` is set (only the lag on Redis 6.2, and on 7.0/7.1 after a
/// trim, is ever counted one by one; the idle pending entries always are:
/// `XPENDING … IDLE`).
///
/// Not counted: scheduled entries that are due but not yet moved into the
/// stream. Scheduled entries (DESIGN.md, `deliver_at`) are not built yet;
/// when they are, their due count is the third part to add here.
///
/// Errors: as [`group_lag`].
pub async fn backlog(
    redis: &Redis,
    stream: &str,
    group: &str,
    unheld_after: Duration,
    limit: usize,
) -> Result<Backlog, Error> {
    let lag = group_lag(redis, stream, group, limit).await?;
    let mut conn = redis.conn.clone();
    let idle: Vec<Value> = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .arg("IDLE")
        .arg(unheld_after.as_millis() as u64)
        .arg("-")
        .arg("+")
        .arg(limit + 1)
        .query_async(&mut conn)
        .await
        .map_err(|e| match fault(&e) {
            Fault::NoGroup | Fault::NoSuchKey => {
                Error::NotFound { what: format!("group `{group}` of stream `{stream}`") }
            }
            _ => Error::from_redis(e, "counting the group's unheld pending entries", stream),
        })?;
    let floor = limit as u64 + 1;
    let lag = Backlog { entries: lag.unwrap_or(floor), at_least: lag.is_none() };
    let unheld = Backlog { entries: (idle.len() as u64).min(floor), at_least: idle.len() > limit };
    Ok(lag + unheld)
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
