//! A consumer group's state as Redis reports it, and its stream's schedule,
//! read in one script round trip: DescribeGroup and the consume path's polled
//! gauges both read them here.
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
    /// Entries in the stream after the group's last-delivered id, as
    /// [`group_lag`] counts them (`lag.lua`); `None` where that cannot be
    /// known cheaply. Never XINFO's figure where Redis miscounts it.
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

/// A stream's schedule (its scheduled entries, Append's `deliver_at`/`delay`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scheduled {
    /// Entries in the schedule (`ZCARD <stream>:scheduled`).
    pub count: u64,
    /// When its first entry is due, unix ms; `None` when it has none.
    pub first_due_ms: Option<u64>,
}

/// What [`state`] read: a group's state and its stream's schedule, each
/// read or failed on its own, as they would as separate commands (a missing
/// group leaves the schedule readable, for the gauges).
#[derive(Debug)]
pub struct State {
    /// The group's state. Errors: [`Error::NotFound`] when the stream or the
    /// group is missing; [`Error::WrongType`] when the stream key holds
    /// another type.
    pub group: Result<GroupState, Error>,
    /// The stream's schedule. Errors: [`Error::WrongType`] (naming the
    /// stream) when the schedule key holds another type.
    pub scheduled: Result<Scheduled, Error>,
}

/// `group`'s state on `stream`, the highest delivery count taken over the
/// oldest `scan` pending entries, and the stream's schedule: one round trip,
/// `group_state.lua` (XINFO GROUPS, XINFO CONSUMERS, XPENDING summary and the
/// oldest `scan`, XLEN, the lag as [`group_lag`] counts it; ZCARD and ZRANGE
/// of the schedule). DescribeGroup's and the polled gauges' one read of it.
///
/// Errors: [`Error::Unavailable`] (or [`Error::Timeout`]) when Redis is not
/// reached; those of each part in [`State`].
pub async fn state(redis: &Redis, stream: &str, group: &str, scan: usize) -> Result<State, Error> {
    let mut conn = redis.conn.clone();
    let reply: Value = redis
        .scripts
        .group_state
        .key(stream)
        .key(redis.keys.scheduled(stream))
        .arg(group)
        .arg(scan)
        .arg(LAG_COUNT_LIMIT)
        .invoke_async(&mut conn)
        .await
        .map_err(|e| Error::from_redis(e, "reading the group's state", stream))?;
    let unexpected = || Error::invalid("group", "unexpected reply from Redis");
    let Value::Array(parts) = reply else { return Err(unexpected()) };
    let [group_part, schedule_part] = <[Value; 2]>::try_from(parts).map_err(|_| unexpected())?;
    let group = part(group_part).map_err(|e| match fault(&e) {
        Fault::NoGroup | Fault::NoSuchKey => Error::NotFound { what: format!("group `{group}` of stream `{stream}`") },
        _ => Error::from_redis(e, "describing the group", stream),
    });
    let scheduled = part(schedule_part).map_err(|e| Error::from_redis(e, "counting a schedule (ZCARD)", stream));
    Ok(State {
        group: group.and_then(|parts| parse_group_state(parts).ok_or_else(unexpected)),
        scheduled: scheduled.and_then(|parts| parse_scheduled(&parts).ok_or_else(unexpected)),
    })
}

/// A part of `group_state.lua`'s reply: its list, or the error Redis raised
/// for it (given as its text, `<CODE> <message>`), as the command would have
/// raised it, so that [`fault`] classifies it alike.
fn part(value: Value) -> Result<Vec<Value>, redis::RedisError> {
    match value {
        Value::Array(items) => Ok(items),
        other => {
            let text = text(&other).unwrap_or_default();
            let (code, detail) = text.split_once(' ').unwrap_or((&text, ""));
            Err(redis::make_extension_error(code.to_owned(), Some(detail.to_owned())))
        }
    }
}

/// The group part of `group_state.lua`'s reply; `None` when not so shaped.
fn parse_group_state(parts: Vec<Value>) -> Option<GroupState> {
    let [info, consumers, summary, oldest, length, lag] = <[Value; 6]>::try_from(parts).ok()?;
    let info = flat_map(&info);
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
    Some(GroupState {
        pending: summary.first().and_then(int).unwrap_or(0),
        lag: int(&lag),
        last_delivered_id: info.get("last-delivered-id").and_then(text).unwrap_or_default(),
        consumers,
        oldest_pending_id,
        oldest_pending_age: oldest_pending_id
            .map(|id| Duration::from_millis(crate::entry::now_unix_ms().saturating_sub(id.ms))),
        max_delivery_count: array(&oldest).iter().filter_map(|e| array(e).get(3).and_then(int)).max().unwrap_or(0),
        stream_length: int(&length).unwrap_or(0),
    })
}

/// The schedule part of `group_state.lua`'s reply: the count, and the first
/// entry's score (a double's text, as ZRANGE WITHSCORES gives it) or nil.
fn parse_scheduled(parts: &[Value]) -> Option<Scheduled> {
    let count = int(parts.first()?)?;
    let first_due_ms = match parts.get(1) {
        None | Some(Value::Nil) => None,
        Some(score) => Some(text(score)?.parse::<f64>().ok()? as u64),
    };
    Some(Scheduled { count, first_due_ms })
}

/// The most entries [`state`]'s lag counts one by one (XRANGE) where
/// Redis' own figure cannot be trusted.
const LAG_COUNT_LIMIT: usize = 100;

/// `group`'s lag on `stream` (`group_lag.lua`, the rule in `lag.lua` that
/// [`state`] also runs): the entries after its
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_part_is_classified_as_the_command_error_it_stands_for() {
        let fault_of = |text: &str| fault(&part(Value::BulkString(text.as_bytes().to_vec())).unwrap_err());
        assert_eq!(fault_of("NOGROUP no group g on s"), Fault::NoGroup);
        assert_eq!(fault_of("ERR no such key"), Fault::NoSuchKey);
        assert_eq!(fault_of("WRONGTYPE Operation against a key holding the wrong kind of value"), Fault::WrongType);
        assert_eq!(part(Value::Array(vec![Value::Int(1)])).unwrap(), vec![Value::Int(1)]);
    }

    #[test]
    fn a_schedule_part_is_its_count_and_first_due_time() {
        let empty = parse_scheduled(&[Value::Int(0), Value::Nil]);
        assert_eq!(empty, Some(Scheduled { count: 0, first_due_ms: None }));
        let due = parse_scheduled(&[Value::Int(2), Value::BulkString(b"1765000000123".to_vec())]);
        assert_eq!(due, Some(Scheduled { count: 2, first_due_ms: Some(1_765_000_000_123) }));
    }
}
