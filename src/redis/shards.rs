//! Sharded streams' shard counts: recorded in Redis by the first sidecar,
//! checked by every other, and the refusals of calls that name a sharded
//! stream or a shard key this sidecar does not know.

use super::{
    connect::Redis,
    fault::{fault, Fault},
};
use crate::error::Error;

impl Redis {
    /// Records each sharded stream's shard count in Redis the first time
    /// (`SET <name>:shards <count> NX`, then `GET`; on a cluster `{<name>}:shards`, see
    /// [`crate::keys::Keyspace::shard_count_key`]) and checks it every time after, so
    /// sidecars configured with different counts for one stream (whose
    /// entries would sit unread in shards a consumer does not know) refuse to
    /// start instead.
    ///
    /// Errors: [`ShardCountError::Mismatch`] naming both counts and the key;
    /// [`ShardCountError::Redis`] when Redis refuses the command.
    pub async fn record_shard_counts(&self) -> Result<(), ShardCountError> {
        let mut conn = self.conn.clone();
        for (name, count) in self.keys.sharded() {
            let key = self.keys.shard_count_key(name);
            // `SET … NX GET` in one command needs Redis 7.0 (6.2 answers a syntax
            // error to NX with GET): SET NX, then GET what is recorded, which is
            // this count when the SET took and the first sidecar's when not.
            let (recorded,): (Option<String>,) = redis::pipe()
                .cmd("SET")
                .arg(&key)
                .arg(count)
                .arg("NX")
                .ignore()
                .cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .map_err(|error| ShardCountError::Redis { key: key.clone(), error })?;
            if let Some(recorded) = recorded.filter(|recorded| *recorded != count.to_string()) {
                return Err(ShardCountError::Mismatch { name: name.to_owned(), recorded, configured: count, key });
            }
        }
        Ok(())
    }

    /// INVALID_ARGUMENT (naming `field`) when `key` is shaped like a shard key
    /// of a stream that another sidecar shards (a count recorded in Redis,
    /// `GET`) but this one does not, or like a shard this sidecar's sharded
    /// stream does not have: appended here, it would get sequence numbers
    /// outside its shard's stride (branded ids could collide across shards),
    /// and a subscription would split the shard's readers. A name like
    /// `user:{user:123}` with no count recorded is an ordinary stream.
    ///
    /// Errors: those above; as [`Redis::recorded_shard_count`] when the `GET` fails.
    pub async fn refuse_foreign_shard_key(&self, field: &'static str, key: &str) -> Result<(), Error> {
        let Some(name) = self.keys.shard_key_check(field, key)? else { return Ok(()) };
        match self.recorded_shard_count(name).await? {
            None => Ok(()),
            Some(count) => Err(Error::invalid(
                field,
                format!(
                    "`{key}` is a shard key of sharded stream `{name}` ({count} shards, recorded in `{}`), which \
                     this sidecar was not started with: start it with --sharded-streams {name}={count}",
                    self.keys.shard_count_key(name)
                ),
            )),
        }
    }

    /// INVALID_ARGUMENT when `stream` names a sharded stream, configured here or
    /// recorded in Redis by other sidecars (one `GET`): for calls that work on one
    /// stream key (Read, Trim, dead letters), which must name a shard. The
    /// message lists the shard keys. Errors also as
    /// [`Redis::recorded_shard_count`] when the `GET` fails.
    pub async fn refuse_sharded(&self, field: &'static str, stream: &str) -> Result<(), Error> {
        let (count, origin) = match self.keys.shards(stream) {
            Some(shards) => (shards.len() as u32, ""),
            None => match self.recorded_shard_count(stream).await? {
                Some(count) => (count, ", recorded in Redis by the sidecars that shard it"),
                None => return Ok(()),
            },
        };
        Err(Error::invalid(
            field,
            format!(
                "`{stream}` is a sharded stream of {count} shards{origin}; name one shard's key (`{}` … `{}`)",
                crate::keys::shard_key(stream, 0),
                crate::keys::shard_key(stream, count - 1)
            ),
        ))
    }

    /// The shard count recorded for `name` by the sidecars that shard it
    /// (`GET` of [`crate::keys::Keyspace::shard_count_key`]); `None` when none is, or the
    /// key holds something else (another type, not a count: see
    /// [`crate::keys::is_recorded_count`]), or `name` has braces (no sharded
    /// stream has them; no query then).
    ///
    /// Errors: as [`Error::from_redis`] when Redis fails the `GET`.
    pub async fn recorded_shard_count(&self, name: &str) -> Result<Option<u32>, Error> {
        let Some(count_key) = self.keys.shard_count_key_to_check(name) else { return Ok(None) };
        let mut conn = self.conn.clone();
        let recorded: Option<String> = match redis::cmd("GET").arg(&count_key).query_async(&mut conn).await {
            Ok(recorded) => recorded,
            Err(e) if fault(&e) == Fault::WrongType => None,
            Err(e) => return Err(Error::from_redis(e, "checking the shard count (GET)", name)),
        };
        Ok(recorded.filter(|count| crate::keys::is_recorded_count(count)).and_then(|count| count.parse().ok()))
    }

    /// Logs a warning for each sharded stream whose name is also a plain
    /// stream in Redis: entries of a stream that existed before it was sharded
    /// stay in that key, which the shards' consumers never read (`TYPE`).
    pub async fn warn_of_plain_namesakes(&self) {
        let mut conn = self.conn.clone();
        for (name, _) in self.keys.sharded() {
            if redis::cmd("TYPE").arg(name).query_async::<String>(&mut conn).await.is_ok_and(|t| t == "stream") {
                tracing::warn!(
                    stream = name,
                    "a plain stream named like this sharded stream exists; its entries are not read by consumers of the \
                     shards: drain it (subscribe to it before sharding) or move them"
                );
            }
        }
    }
}

/// Why [`Redis::record_shard_counts`] refused.
#[derive(Debug, thiserror::Error)]
pub enum ShardCountError {
    /// Redis holds another count for the stream.
    #[error(
        "sharded stream `{name}` is recorded in Redis with {recorded} shards (key `{key}`), but this sidecar is \
         configured with {configured} (--sharded-streams): every sidecar must use the same count; to change it, \
         drain the stream, stop its sidecars, DEL `{key}` and restart them with the new count"
    )]
    Mismatch {
        /// The sharded stream.
        name: String,
        /// The count Redis holds.
        recorded: String,
        /// This sidecar's count.
        configured: u32,
        /// The key holding it.
        key: String,
    },
    /// Redis refused or failed the command (`WRONGTYPE`: the key holds
    /// something else, such as a stream appended under that name).
    #[error("recording the shard count in Redis (SET `{key}` NX, GET) failed: {error}")]
    Redis {
        /// The key it was to be recorded in.
        key: String,
        /// What Redis said.
        error: redis::RedisError,
    },
}
