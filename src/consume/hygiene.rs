//! Consumer hygiene (`hygiene.lua`): every beat records this sidecar's
//! heartbeat in the group's heartbeat hash, and every thorough beat (an
//! eighth of the limit apart, see [`thorough_every`]) removes the group's
//! consumers that have been idle past `--consumer-idle-limit-ms`, hold
//! nothing and have no fresh heartbeat, so XINFO stays readable as pods come
//! and go. Never one
//! with pending entries (XGROUP DELCONSUMER would drop its PEL), never this
//! sidecar's own, and never a live sidecar's: Redis 7.0 leaves the idle time
//! of a consumer blocked on a quiet stream growing, so only the heartbeat
//! tells a live sidecar from a dead one.
//!
//! The worker of a group outlives its last call, so its beat may find the
//! stream deleted (DEL, FLUSHALL, a Redis restart without persistence). It
//! says so once, in words, records nothing while the stream is gone, and
//! says so again when the stream is back.
//!
//! It may also find the stream there without the group (XGROUP DESTROY
//! behind the sidecars' back; DestroyGroup removes the keys itself). Then it
//! records nothing either, and removes the group's own keys
//! ([`crate::keys::Keyspace::group_keys`]), which would otherwise outlive it
//! (the retry hash has no expiry). It does not re-create the group: a worker
//! with no call open leaves a destroyed group destroyed; a call's next read
//! re-creates it (`recovery.rs`).

use std::time::Duration;

use redis::{RedisResult, Value};

use super::GroupKeys;
use crate::redis::{array, bytes, int};

/// The longest time between two heartbeats of a sidecar.
const MAX_BEAT: Duration = Duration::from_secs(10);

/// A sidecar whose last heartbeat for a group is at most this old serves it,
/// as a sidecar beating every `beat` counts: three beats, so one late or lost
/// beat does not drop a peer. A peer that beats less often (a longer
/// `--consumer-idle-limit-ms`) may be missed between its beats; a group then
/// shares where it could block, which costs work, never an entry.
pub(crate) fn serving_beat_age(beat: Duration) -> Duration {
    3 * beat
}

/// How often a worker beats: a quarter of its idle limit (so a peer with the
/// same limit sees at least three beats within it), at most [`MAX_BEAT`], at
/// least 100 ms; every [`MAX_BEAT`] without a limit (the heartbeat still
/// keeps peers that clean from removing this sidecar).
pub(crate) fn beat_interval(idle_limit: Option<Duration>) -> Duration {
    idle_limit.map_or(MAX_BEAT, |limit| (limit / 4).clamp(Duration::from_millis(100), MAX_BEAT))
}

/// How far apart thorough beats are when no idle limit is set: they still
/// renew the heartbeat hash's expiry.
const THOROUGH_WITHOUT_LIMIT: Duration = Duration::from_secs(450);

/// Every how many beats one is thorough (see [`beat`]): about an eighth of
/// the idle limit apart (7.5 minutes at the default hour; every beat for a
/// limit under 80 s), so a dead consumer goes within 1⅛ limits of its last
/// beat. Beats in between record the heartbeat alone.
pub(crate) fn thorough_every(idle_limit: Option<Duration>) -> u64 {
    let span = idle_limit.map_or(THOROUGH_WITHOUT_LIMIT, |limit| limit / 8);
    (span.as_millis() / beat_interval(idle_limit).as_millis()).max(1) as u64
}

/// What one hygiene beat (`hygiene.lua`) found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Beat {
    /// The heartbeat is recorded; these dead consumers were removed (often none).
    Done {
        /// The consumers removed, by name.
        removed: Vec<String>,
        /// The sidecars serving the group: heartbeats younger than
        /// [`serving_beat_age`], this one's included; 0 when the group is gone.
        sidecars: usize,
    },
    /// The stream does not exist: nothing was recorded or removed.
    StreamGone,
}

/// Records this sidecar's heartbeat and, on a `thorough` beat with
/// `idle_limit`, removes the dead consumers (`EVALSHA hygiene.lua`, one
/// atomic run). A light beat runs `XPENDING` (of no entries, to see that the
/// group exists), `TIME`, `HSET` and `HVALS`; a thorough one lists the
/// consumers too (`XINFO CONSUMERS`, an `HGET` each) and renews the
/// heartbeat hash's expiry.
///
/// A group gone from an existing stream is `Done` with nobody removed (its
/// own keys are, and logged here when there were any).
///
/// Errors: Redis'.
pub(crate) async fn beat(keys: &GroupKeys, idle_limit: Option<Duration>, thorough: bool) -> RedisResult<Beat> {
    let mut conn = keys.redis.conn.clone();
    let mut script = keys.redis.scripts.hygiene.prepare_invoke();
    // The heartbeat hash comes first among the group's own keys, as the script expects.
    script.key(&keys.stream).key(keys.own_keys.as_slice());
    script.arg(&keys.group).arg(&keys.consumer).arg(idle_limit.map_or(0, |limit| limit.as_millis().max(1) as u64));
    script.arg(serving_beat_age(beat_interval(idle_limit)).as_millis() as u64).arg(u8::from(thorough));
    let reply: Value = script.invoke_async(&mut conn).await?;
    match reply {
        Value::Nil => Ok(Beat::StreamGone),
        Value::Int(removed) => {
            if removed > 0 {
                tracing::info!(stream = %keys.stream, group = %keys.group, keys = removed, "the group no longer exists (destroyed behind the sidecar's back): removed the keys it left behind, and no heartbeat is recorded for it");
            }
            Ok(Beat::Done { removed: Vec::new(), sidecars: 0 })
        }
        reply => parse_done(&reply),
    }
}

/// `{sidecars, {names removed…}}`.
fn parse_done(reply: &Value) -> RedisResult<Beat> {
    let parts = array(reply);
    let (Some(sidecars), Some(names)) = (parts.first(), parts.get(1)) else {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected reply from Redis",
            format!("hygiene.lua: {reply:?}"),
        )));
    };
    let removed = array(names).iter().map(|name| Ok(String::from_utf8_lossy(&bytes(name)?).into_owned()));
    Ok(Beat::Done { removed: removed.collect::<RedisResult<_>>()?, sidecars: int(sidecars)?.max(0) as usize })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thorough_beats_come_an_eighth_of_the_limit_apart() {
        let hour = Some(Duration::from_secs(3600));
        assert_eq!(beat_interval(hour), MAX_BEAT);
        assert_eq!(thorough_every(hour), 45, "7.5 minutes of 10 s beats");
        assert_eq!(thorough_every(None), 45, "without a limit, as often as at the default hour");
        assert_eq!(thorough_every(Some(Duration::from_secs(4))), 1, "a short limit: every beat, as before");
        assert_eq!(thorough_every(Some(Duration::from_secs(80))), 1);
        assert_eq!(thorough_every(Some(Duration::from_secs(160))), 2);
    }
}
