//! The subscribe: validation of its fields (every bad value gets
//! INVALID_ARGUMENT naming the field), and the group door on each shard.

use std::time::Duration;

use super::{
    ledger::Policy,
    orders::{Backoff, GroupPolicy, KeyLimit},
    Consumers,
};
use crate::{
    error::Error,
    id::StreamId,
    proto::{GroupStart, Subscribe},
    security::Caller,
};

impl Consumers {
    pub(super) fn validate(
        &self,
        caller: Option<&Caller>,
        subscribe: Subscribe,
    ) -> Result<(Subscription, Policy), Error> {
        let stream = self.guard.stream(caller, "subscribe.stream", &subscribe.stream)?.to_owned();
        let keys = &self.shared.redis.keys;
        let shards = keys.shards(&stream).unwrap_or_else(|| vec![stream.clone()]);
        let group = self.guard.name("subscribe.group", &subscribe.group)?.to_owned();
        let start = match GroupStart::try_from(subscribe.group_start) {
            Ok(GroupStart::New) => "$".to_owned(),
            Ok(GroupStart::Beginning) => "0".to_owned(),
            Ok(GroupStart::Id) => subscribe
                .start_id
                .parse::<StreamId>()
                .map_err(|e| Error::invalid("subscribe.start_id", format!("required with GROUP_START_ID: {e}")))?
                .to_string(),
            Ok(GroupStart::Instant) => {
                let at = subscribe.start_time.ok_or_else(|| {
                    Error::invalid("subscribe.start_time", "required with GROUP_START_INSTANT")
                })?;
                let ms = crate::entry::unix_ms_of("subscribe.start_time", at)?;
                let latest = crate::entry::now_unix_ms() + START_TIME_SKEW.as_millis() as u64;
                if ms > latest {
                    return Err(Error::invalid(
                        "subscribe.start_time",
                        format!(
                            "{} ms in the future: a new group would skip every entry appended until then \
                             (a unit mix-up?); give an instant in the past (at most {} s ahead, for clock skew)",
                            ms - crate::entry::now_unix_ms(),
                            START_TIME_SKEW.as_secs()
                        ),
                    ));
                }
                // The group's last-delivered id is exclusive: the last id before `ms`.
                StreamId { ms, seq: 0 }.predecessor().map_or_else(|| "0".to_owned(), |id| id.to_string())
            }
            Ok(GroupStart::Unspecified) => {
                return Err(Error::invalid(
                    "subscribe.group_start",
                    "required: GROUP_START_NEW (only new entries), GROUP_START_BEGINNING (everything the stream holds), GROUP_START_ID or GROUP_START_INSTANT",
                ))
            }
            Err(_) => {
                return Err(Error::invalid(
                    "subscribe.group_start",
                    format!(
                        "{} is not a GroupStart: GROUP_START_NEW (1), GROUP_START_BEGINNING (2), GROUP_START_ID (3) or GROUP_START_INSTANT (4)",
                        subscribe.group_start
                    ),
                ))
            }
        };
        let max_in_flight = match subscribe.max_in_flight {
            0 => self.defaults.max_in_flight,
            n if n > self.defaults.max_in_flight_limit => {
                return Err(Error::invalid(
                    "subscribe.max_in_flight",
                    format!("{n} is above this sidecar's limit of {}", self.defaults.max_in_flight_limit),
                ))
            }
            n => n,
        }
        // Each shard gets a share of the credit, at least one entry.
        .max(shards.len() as u32);
        let key_limit = self.key_limit(&subscribe, shards.len() > 1)?;
        let ack_deadline = duration("subscribe.ack_deadline", subscribe.ack_deadline)?.filter(|d| !d.is_zero());
        let backoff_initial = duration("subscribe.retry_backoff_initial", subscribe.retry_backoff_initial)?
            .unwrap_or(self.defaults.backoff.initial);
        let backoff_max =
            duration("subscribe.retry_backoff_max", subscribe.retry_backoff_max)?.unwrap_or(self.defaults.backoff.max);
        if backoff_initial > backoff_max {
            return Err(Error::invalid(
                "subscribe.retry_backoff_initial",
                format!("{backoff_initial:?} is above retry_backoff_max ({backoff_max:?})"),
            ));
        }
        let dead_letter_stream = match subscribe.dead_letter_stream {
            name if name.is_empty() => None,
            name => Some(self.guard.stream(caller, "subscribe.dead_letter_stream", &name)?.to_owned()),
        };
        let mut dead_letter_streams = Vec::with_capacity(shards.len());
        for shard in &shards {
            let dead_letters = dead_letter_stream.clone().unwrap_or_else(|| keys.dead_letter_stream(shard));
            if dead_letters == *shard {
                return Err(Error::invalid(
                    "subscribe.dead_letter_stream",
                    "must differ from the stream: dead letters appended to their own stream come back for ever",
                ));
            }
            let field = if dead_letter_stream.is_some() { "subscribe.dead_letter_stream" } else { "subscribe.stream" };
            keys.same_slot(field, shard, &dead_letters)?;
            keys.same_slot("subscribe.stream", shard, &keys.retries(shard, &group))?;
            dead_letter_streams.push(dead_letters);
        }
        let max_deliveries = match subscribe.max_deliveries {
            0 => self.defaults.max_deliveries,
            n => n,
        };
        if key_limit.is_some() {
            for shard in &shards {
                keys.same_slot("subscribe.stream", shard, &keys.keys(shard, &group))?;
            }
        }
        let backoff = Backoff { initial: backoff_initial, max: backoff_max };
        let adaptive = subscribe.max_in_flight == 0;
        let policy = Policy { max_in_flight, adaptive, ack_deadline, backoff, sharded: shards.len() > 1 };
        let shards = shards
            .into_iter()
            .zip(dead_letter_streams)
            .map(|(key, dead_letter_stream)| {
                (key, GroupPolicy { max_deliveries, dead_letter_stream, keys: key_limit.clone() })
            })
            .collect();
        let max_batch = match subscribe.max_batch {
            n if n > MAX_BATCH => {
                return Err(Error::invalid("subscribe.max_batch", format!("{n} is above the limit of {MAX_BATCH}")))
            }
            n => n.max(1) as usize,
        };
        let sub = Subscription { stream, shards, group, start, no_ack: subscribe.no_ack, max_batch };
        Ok((sub, policy))
    }

    /// The per-key limit of `subscribe` (`key_field`, `max_in_flight_per_key`),
    /// `None` when it asks for none. INVALID_ARGUMENT, naming the field and
    /// what to do: one of the two without the other, a key field over
    /// `--max-name-bytes` or named like the reserved branded-id field, a
    /// limit over `--max-in-flight-limit`, with `no_ack` (no PEL to keep a
    /// key's entries in order), on a sharded stream (the limit is kept per
    /// stream key).
    fn key_limit(&self, subscribe: &Subscribe, sharded: bool) -> Result<Option<KeyLimit>, Error> {
        let (field, per_key) = (subscribe.key_field.as_str(), subscribe.max_in_flight_per_key);
        if field.is_empty() {
            if per_key > 0 {
                return Err(Error::invalid(
                    "subscribe.key_field",
                    "required with max_in_flight_per_key: name the payload field whose value is an entry's key \
                     (or send max_in_flight_per_key 0 for no per-key limit)",
                ));
            }
            return Ok(None);
        }
        self.guard.name("subscribe.key_field", field)?;
        if per_key == 0 {
            return Err(Error::invalid(
                "subscribe.max_in_flight_per_key",
                "required with key_field: the most entries of one key held at once in the group \
                 (1 handles a key's entries one at a time, in stream order)",
            ));
        }
        if per_key > self.defaults.max_in_flight_limit {
            return Err(Error::invalid(
                "subscribe.max_in_flight_per_key",
                format!("{per_key} is above this sidecar's limit of {}", self.defaults.max_in_flight_limit),
            ));
        }
        if field == self.shared.id_field {
            return Err(Error::invalid(
                "subscribe.key_field",
                format!("`{field}` is the reserved branded-id field (--id-field), unique per entry: name the field that holds the key"),
            ));
        }
        if subscribe.no_ack {
            return Err(Error::invalid(
                "subscribe.key_field",
                "per-key limits keep a key's entries in the PEL until each is settled, and an at-most-once (no_ack) \
                 subscription has no PEL: drop no_ack or key_field",
            ));
        }
        if sharded {
            return Err(Error::invalid(
                "subscribe.key_field",
                format!(
                    "`{}` is a sharded stream, and per-key limits are kept per stream key: use one plain stream \
                     (on a Redis Cluster, with a hash tag, e.g. `{{orders}}`), or a partition key per shard",
                    subscribe.stream
                ),
            ));
        }
        Ok(Some(KeyLimit { field: field.to_owned(), per_key }))
    }

    /// The group door, on each shard: `XGROUP CREATE <stream> <group> <start>
    /// MKSTREAM`. Only BUSYGROUP (the group exists; it keeps its position) is
    /// not an error. Then registers this sidecar's consumer (XGROUP
    /// CREATECONSUMER), so it shows in XINFO CONSUMERS before it first
    /// receives anything.
    pub(super) async fn open_groups(&self, sub: &Subscription) -> Result<(), Error> {
        for (stream, policy) in &sub.shards {
            self.check_types(stream, &policy.dead_letter_stream, &sub.group).await?;
            self.open_group(sub, stream).await?;
        }
        Ok(())
    }

    /// The dead-letter stream, the retry hash and the keyed entries, when
    /// they exist, must be a stream, a hash and a sorted set: another type would fail every dead-lettering or
    /// retry write of the group later (WRONGTYPE), so it is refused now with
    /// FAILED_PRECONDITION. So is a plain stream another sidecar recorded as
    /// sharded (this one was not started with it: it would wait on a key no
    /// producer writes).
    async fn check_types(&self, stream: &str, dead_letters: &str, group: &str) -> Result<(), Error> {
        self.shared.redis.refuse_foreign_shard_key("subscribe.stream", stream).await?;
        let keys = &self.shared.redis.keys;
        let retries = keys.retries(stream, group);
        let keyed = keys.keys(stream, group);
        let wanted = [(dead_letters, "stream"), (retries.as_str(), "hash"), (keyed.as_str(), "zset")];
        if let Some(count) = self.shared.redis.recorded_shard_count(stream).await? {
            return Err(keys.unconfigured_sharded(stream, &count.to_string()));
        }
        // One round trip; on a cluster both keys share the stream's slot (checked in validation).
        let mut pipe = redis::pipe();
        for (key, _) in wanted {
            pipe.cmd("TYPE").arg(key);
        }
        let mut conn = self.shared.redis.conn.clone();
        let found: Vec<String> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::from_redis(e, "checking the group's keys (TYPE)", stream))?;
        for ((key, wanted), found) in wanted.into_iter().zip(found) {
            if found != "none" && found != wanted {
                return Err(Error::Conflict {
                    reason: format!(
                        "key `{key}` holds a {found}, but the group needs a {wanted} there; delete it or pick another name"
                    ),
                });
            }
        }
        Ok(())
    }

    async fn open_group(&self, sub: &Subscription, stream: &str) -> Result<(), Error> {
        let mut conn = self.shared.redis.conn.clone();
        let created: Result<(), redis::RedisError> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream)
            .arg(&sub.group)
            .arg(&sub.start)
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await;
        match created {
            Ok(()) => tracing::info!(stream, group = %sub.group, start = %sub.start, "group created"),
            Err(e) if crate::redis::fault(&e) == crate::redis::Fault::BusyGroup => {}
            Err(e) => return Err(Error::from_redis(e, "creating the group (XGROUP CREATE)", stream)),
        }
        redis::cmd("XGROUP")
            .arg("CREATECONSUMER")
            .arg(stream)
            .arg(&sub.group)
            .arg(&self.shared.consumer)
            .query_async::<i64>(&mut conn)
            .await
            .map_err(|e| Error::from_redis(e, "registering the consumer (XGROUP CREATECONSUMER)", stream))?;
        Ok(())
    }
}

/// A validated subscribe.
pub(super) struct Subscription {
    /// The stream as subscribed: a stream key, or a sharded stream's name.
    pub(super) stream: String,
    /// The stream keys consumed (the shards of a sharded stream, else the
    /// stream itself), each with its group settings.
    pub(super) shards: Vec<(String, GroupPolicy)>,
    pub(super) group: String,
    /// The XGROUP CREATE start argument.
    pub(super) start: String,
    /// At-most-once mode.
    pub(super) no_ack: bool,
    /// Deliveries per frame, 1 to [`MAX_BATCH`]; 1: one `Delivery` per frame.
    pub(super) max_batch: usize,
}

/// The most deliveries a subscribe may ask for per frame (`max_batch`).
pub(crate) const MAX_BATCH: u32 = 4096;

/// How far in the future a GROUP_START_INSTANT may lie: clock skew between
/// the client and Redis, not a schedule.
const START_TIME_SKEW: Duration = Duration::from_secs(60);

/// The longest delay or deadline a request may name: far beyond any sane
/// retry, and far from the overflow of `Instant` arithmetic.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// A proto Duration as a std one; `None` when unset. INVALID_ARGUMENT when
/// negative, malformed (nanos outside 0..1e9) or over [`MAX_DURATION`]. Checked
/// by hand: prost's conversion negates, which overflows on `i64::MIN`.
pub(crate) fn duration(field: &'static str, value: Option<prost_types::Duration>) -> Result<Option<Duration>, Error> {
    let Some(value) = value else { return Ok(None) };
    if (value.seconds > 0 && value.nanos < 0) || (value.seconds < 0 && value.nanos > 0) {
        return Err(Error::invalid(
            field,
            format!(
                "seconds ({}) and nanos ({}) have different signs; a Duration's two parts share one sign",
                value.seconds, value.nanos
            ),
        ));
    }
    if value.seconds < 0 || value.nanos < 0 {
        return Err(Error::invalid(field, "must not be negative"));
    }
    if value.nanos >= 1_000_000_000 {
        return Err(Error::invalid(field, "nanos must be below 1,000,000,000"));
    }
    let duration = Duration::new(value.seconds as u64, value.nanos as u32);
    if duration > MAX_DURATION {
        return Err(Error::invalid(field, "must be at most 365 days"));
    }
    Ok(Some(duration))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_start_is_exclusive_of_the_millisecond_before() {
        let id = StreamId { ms: 1000, seq: 0 }.predecessor().unwrap();
        assert_eq!(id.to_string(), "999-18446744073709551615");
    }

    #[test]
    fn durations_are_checked_without_overflow() {
        let d = |seconds, nanos| duration("f", Some(prost_types::Duration { seconds, nanos }));
        assert!(d(-1, 0).is_err());
        assert!(d(i64::MIN, 0).is_err());
        assert!(d(0, i32::MIN).is_err());
        assert!(d(i64::MAX, 999_999_999).is_err());
        assert!(d(0, 1_000_000_000).is_err());
        let mixed = d(1, -5).unwrap_err().to_string();
        assert!(mixed.contains("different signs"), "{mixed}");
        assert!(d(-1, 5).unwrap_err().to_string().contains("different signs"));
        assert!(d(-1, 0).unwrap_err().to_string().contains("must not be negative"));
        assert_eq!(d(1, 5).unwrap(), Some(Duration::new(1, 5)));
        assert_eq!(duration("f", None).unwrap(), None);
    }
}
