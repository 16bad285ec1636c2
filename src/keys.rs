//! Key names: the keys the sidecar derives from a stream's name, and the shard
//! keys of sharded streams.
//!
//! On a Redis Cluster every multi-key step (the dead-letter script, the retry
//! hash written beside an XACK) must stay on one slot, so derived keys share
//! the stream's slot:
//!
//! - a stream whose name has a `{hash tag}` keeps it: `{orders}:dlq`;
//! - on a cluster, a stream without one gets its whole name as the tag of the
//!   derived keys: stream `orders`, dead-letter stream `{orders}:dlq` (Redis
//!   hashes `orders` and `{orders}:dlq` to the same slot);
//! - on a single Redis server names stay as they always were: `orders:dlq`.
//!
//! A sharded stream `orders` of N shards is N stream keys, `orders:{orders:0}`
//! … `orders:{orders:N-1}`: each shard's tag differs, so shards spread over the
//! cluster's slots, and each shard's derived keys share its tag.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicUsize, Ordering},
};

use redis::cluster_routing::Slot;

use crate::error::Error;

/// The most shards a sharded stream may have.
pub const MAX_SHARDS: u32 = 1024;

/// Which stream key an append goes to, and the id stride it mints with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendTarget {
    /// The stream key written.
    pub key: String,
    /// The shard's index (0-based); 0 for a plain stream.
    pub shard: u32,
    /// The stream's shard count; 1 for a plain stream. `append.lua` mints
    /// sequence numbers congruent to `shard` modulo `shards`, so branded ids
    /// are unique across all shards of a logical stream.
    pub shards: u32,
}

/// The sidecars' index of stream keys with scheduled entries: a sorted set of
/// stream key by the unix ms its earliest scheduled entry is due at (or
/// earlier: a mover corrects it). Every sidecar's mover polls it, so an entry
/// is moved even when no sidecar appends to or consumes its stream. One key
/// for the whole database; on a cluster it has a slot of its own, and is
/// written by separate commands ordered so that no schedule is left out of it
/// (see `stream::scheduled`). No key derived from a stream's name takes this
/// name: no derived suffix (`:dlq`, `:scheduled`, `:dedup:<key>`, …) is `:scheduled-index`;
/// only a stream named exactly so would clash.
pub const SCHEDULED_INDEX: &str = "echomq:scheduled-index";

/// Why a name with braces but no usable `{hash tag}` (`x{}y`, `a}b`) cannot
/// be consumed on a cluster.
const NO_USABLE_TAG: &str = "this stream's name has braces but no usable {hash tag}, so no key derived from it \
     can share its slot: on a Redis Cluster, name the stream with a hash tag (e.g. `{orders}`)";

/// How this sidecar names keys: whether Redis is a cluster, and which streams
/// are sharded (`--sharded-streams`).
#[derive(Debug, Default)]
pub struct Keyspace {
    cluster: bool,
    /// Logical stream name → shard count.
    sharded: BTreeMap<String, u32>,
    /// Per sharded stream, the turn of the next append without a partition key.
    turns: BTreeMap<String, AtomicUsize>,
}

impl Keyspace {
    /// A keyspace for a cluster (`cluster`) or a single server, with the given
    /// sharded streams (name → shard count, validated by [`parse_sharded`]).
    pub fn new(cluster: bool, sharded: BTreeMap<String, u32>) -> Keyspace {
        let turns = sharded.keys().map(|name| (name.clone(), AtomicUsize::new(0))).collect();
        Keyspace { cluster, sharded, turns }
    }

    /// True when Redis is a cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The default dead-letter stream of `stream`: `<stream>:dlq`, or on a
    /// cluster `{<stream>}:dlq` when the name has no hash tag.
    pub fn dead_letter_stream(&self, stream: &str) -> String {
        self.derived(stream, ":dlq")
    }

    /// The fold lease of `stream` (the archive's: one sidecar at a time folds
    /// and trims it; the value is the holder's token): `<stream>:archive:lease`,
    /// tagged like [`Self::dead_letter_stream`].
    pub fn fold_lease(&self, stream: &str) -> String {
        self.derived(stream, ":archive:lease")
    }

    /// Where the archive of `stream` ends, as far as trims went: the
    /// `archived_through` id (`<ms>-<seq>`) of the manifest its last fold
    /// trimmed by, written by `trim.lua` in the same step as the XTRIM. Every
    /// entry trimmed into the archive is at or below it, so a Read that starts
    /// after it needs the stream only: `<stream>:archive:through`, tagged like
    /// [`Self::dead_letter_stream`].
    pub fn archive_through(&self, stream: &str) -> String {
        self.derived(stream, ":archive:through")
    }

    /// The retry hash of `group` on `stream` (stream id → `<due unix ms> <last
    /// failure reason>`, the ms followed by `t` after a transient Fail):
    /// `<stream>:retries:<group>`, tagged like
    /// [`Self::dead_letter_stream`].
    pub fn retries(&self, stream: &str, group: &str) -> String {
        self.derived(stream, &format!(":retries:{group}"))
    }

    /// The heartbeat hash of `group` on `stream` (consumer → Redis time, unix
    /// ms, of its sidecar's last hygiene beat): `<stream>:heartbeats:<group>`,
    /// tagged like [`Self::dead_letter_stream`].
    pub fn heartbeats(&self, stream: &str, group: &str) -> String {
        self.derived(stream, &format!(":heartbeats:{group}"))
    }

    /// The keyed entries of `group` on `stream` (per-key limits,
    /// `Subscribe.key_field`): a sorted set, every score 0, whose members
    /// are `<key length>:<key bytes>:<ms>-<seq>` with the stream id's two
    /// parts zero-padded to 20 digits, so `ZRANGEBYLEX` over one key's
    /// prefix lists its pending entries in stream order (see
    /// `crate::consume` and its `keyed` module): `<stream>:keys:<group>`,
    /// tagged like [`Self::dead_letter_stream`] so the read and gate scripts
    /// touch it with the stream.
    pub fn keys(&self, stream: &str, group: &str) -> String {
        self.derived(stream, &format!(":keys:{group}"))
    }

    /// Every key the sidecars keep for `group` on `stream` alone, heartbeat
    /// hash first: what DestroyGroup removes with the group, and what the
    /// hygiene beat removes when it finds the group gone. A new per-group key
    /// belongs here, or it outlives its group. The dead-letter stream is not
    /// one: it is the stream's (shared by its groups) and holds user data.
    pub fn group_keys(&self, stream: &str, group: &str) -> [String; 3] {
        [self.heartbeats(stream, group), self.retries(stream, group), self.keys(stream, group)]
    }

    /// The dedup record of `dedup_key` on the stream key `stream` (an
    /// Append's `dedup_key`): a string `<stream id> <branded id>` of the
    /// first append with that key, expiring after `--dedup-window-ms`:
    /// `<stream>:dedup:<dedup_key>`, tagged like [`Self::dead_letter_stream`]
    /// so `append.lua` can read and write it with the stream. A dedup key's
    /// own braces never move it: the stream's tag (or the whole name as one)
    /// comes first. One key per dedup key rather than one hash per stream,
    /// because a hash field's own expiry (HEXPIRE) needs Redis 7.4.
    pub fn dedup(&self, stream: &str, dedup_key: &str) -> String {
        self.derived(stream, &format!(":dedup:{dedup_key}"))
    }

    /// The schedule of the stream key `stream`: a sorted set of the branded
    /// ids of its scheduled entries (Append's `deliver_at`/`delay`) by the
    /// unix ms each is due at: `<stream>:scheduled`, tagged like
    /// [`Self::dead_letter_stream`] so one script moves entries from it into
    /// the stream.
    pub fn scheduled(&self, stream: &str) -> String {
        self.derived(stream, ":scheduled")
    }

    /// The scheduled entries of the stream key `stream`: a hash of branded id
    /// → the entry's fields (encoded by `prelude.lua`'s `encode_fields`), and
    /// `shard` → `<k> <n>` (the stride its stream ids are minted with):
    /// `<stream>:scheduled:entries`, tagged like [`Self::dead_letter_stream`].
    pub fn scheduled_entries(&self, stream: &str) -> String {
        self.derived(stream, ":scheduled:entries")
    }

    /// The move lease of the stream key `stream` (one sidecar at a time moves
    /// its due scheduled entries; the value is the holder's token):
    /// `<stream>:scheduled:lease`, tagged like [`Self::dead_letter_stream`].
    pub fn scheduled_lease(&self, stream: &str) -> String {
        self.derived(stream, ":scheduled:lease")
    }

    fn derived(&self, stream: &str, suffix: &str) -> String {
        if self.cluster && hash_tag(stream).is_none() {
            format!("{{{stream}}}{suffix}")
        } else {
            format!("{stream}{suffix}")
        }
    }

    /// On a cluster, INVALID_ARGUMENT unless `key` (named by `field`) hashes to
    /// `stream`'s slot: a script touching both would fail with CROSSSLOT.
    pub fn same_slot(&self, field: &'static str, stream: &str, key: &str) -> Result<(), Error> {
        if !self.cluster || Slot::for_key(stream) == Slot::for_key(key) {
            return Ok(());
        }
        let default = self.dead_letter_stream(stream);
        let hint = if Slot::for_key(stream) == Slot::for_key(&default) {
            format!("name one on the stream's slot, such as the default `{default}` (leave the field empty for it)")
        } else {
            NO_USABLE_TAG.to_owned()
        };
        Err(Error::invalid(
            field,
            format!(
                "`{key}` and stream `{stream}` hash to different Redis Cluster slots, and one script must touch both; {hint}"
            ),
        ))
    }

    /// On a cluster, INVALID_ARGUMENT (naming `field`) when `stream` could not
    /// be consumed: its name has braces but no usable hash tag (`x{}y`, `a}b`),
    /// so its dead-letter stream and retry hash cannot share its slot. Append
    /// refuses such a name rather than write entries no group can take.
    pub fn consumable(&self, field: &'static str, stream: &str) -> Result<(), Error> {
        if !self.cluster || Slot::for_key(stream) == Slot::for_key(self.dead_letter_stream(stream)) {
            return Ok(());
        }
        Err(Error::invalid(field, format!("stream `{stream}` cannot be consumed on a Redis Cluster: {NO_USABLE_TAG}")))
    }

    /// The sharded streams and their shard counts.
    pub fn sharded(&self) -> impl Iterator<Item = (&str, u32)> {
        self.sharded.iter().map(|(name, count)| (name.as_str(), *count))
    }

    /// The shard keys of `stream` when it is a sharded stream, in shard order.
    pub fn shards(&self, stream: &str) -> Option<Vec<String>> {
        let count = *self.sharded.get(stream)?;
        Some((0..count).map(|k| shard_key(stream, k)).collect())
    }

    /// Where an append to `stream` goes. A sharded stream's shard is picked by
    /// a stable hash of `partition_key` (FNV-1a, 64 bits, modulo the shard
    /// count), or round-robin when it is empty; so entries with one partition
    /// key stay in one shard, in order. A shard key named directly is written
    /// as that shard. A plain stream ignores the partition key.
    pub fn append_target(&self, stream: &str, partition_key: &[u8]) -> AppendTarget {
        if let Some(&shards) = self.sharded.get(stream) {
            let shard = if partition_key.is_empty() {
                let turn = self.turns.get(stream).map_or(0, |turn| turn.fetch_add(1, Ordering::Relaxed));
                (turn % shards as usize) as u32
            } else {
                (fnv1a(partition_key) % u64::from(shards)) as u32
            };
            return AppendTarget { key: shard_key(stream, shard), shard, shards };
        }
        match self.shard_of(stream) {
            Some((shard, shards)) => AppendTarget { key: stream.to_owned(), shard, shards },
            None => AppendTarget { key: stream.to_owned(), shard: 0, shards: 1 },
        }
    }

    /// The sharded stream `key` is a shard of, else `key` itself.
    pub fn sharded_stream_of<'a>(&self, key: &'a str) -> &'a str {
        match self.shard_of(key) {
            Some(_) => key.split_once(":{").map_or(key, |(name, _)| name),
            None => key,
        }
    }

    /// `(shard index, shard count)` when `key` is a shard key of a configured
    /// sharded stream.
    fn shard_of(&self, key: &str) -> Option<(u32, u32)> {
        let (name, shard) = parse_shard_key(key)?;
        let &shards = self.sharded.get(name)?;
        (shard < shards).then_some((shard, shards))
    }

    /// For a `key` shaped like a shard key (`<name>:{<name>:<k>}`): `Ok(None)`
    /// when it is one of this sidecar's shards or not shard-shaped; the
    /// `name` to look up in Redis when this sidecar does not shard `name`
    /// (see [`crate::redis::Redis::refuse_foreign_shard_key`]); INVALID_ARGUMENT
    /// (naming `field`) when `name` is sharded here but has no shard `k`.
    pub fn shard_key_check<'a>(&self, field: &'static str, key: &'a str) -> Result<Option<&'a str>, Error> {
        let Some((name, shard)) = parse_shard_key(key) else { return Ok(None) };
        match self.sharded.get(name) {
            Some(&shards) if shard < shards => Ok(None),
            Some(&shards) => Err(Error::invalid(
                field,
                format!("`{key}` is not a shard of sharded stream `{name}`, which has shards 0 to {}", shards - 1),
            )),
            None => Ok(Some(name)),
        }
    }

    /// The key that records the shard count of sharded stream `name` in
    /// Redis: `<name>:shards`, or on a cluster `{<name>}:shards`, on the slot a
    /// plain stream `name` would have, so `append.lua` can check it.
    pub fn shard_count_key(&self, name: &str) -> String {
        self.derived(name, ":shards")
    }

    /// The shard-count key to check before writing to or waiting on the plain
    /// stream `stream` ([`Self::shard_count_key`]); `None` for a name with
    /// braces, which no sharded stream has (shard keys and tagged names).
    pub fn shard_count_key_to_check(&self, stream: &str) -> Option<String> {
        (!stream.contains(['{', '}'])).then(|| self.shard_count_key(stream))
    }

    /// FAILED_PRECONDITION for a plain stream `name` that another sidecar
    /// recorded as sharded with `count` shards, while this one was not started
    /// with it: its appends and reads would miss the shards.
    pub fn unconfigured_sharded(&self, name: &str, count: &str) -> Error {
        Error::Conflict {
            reason: format!(
                "stream `{name}` is sharded ({count} shards, recorded in `{}`), but this sidecar was not started with \
                 it: start it with --sharded-streams {name}={count}, like the sidecars that shard it",
                self.shard_count_key(name)
            ),
        }
    }
}

/// Whether `text` is a shard count as sidecars record it: 1 to
/// [`MAX_SHARDS`] in plain decimal (`append.lua` applies the same rule).
pub fn is_recorded_count(text: &str) -> bool {
    !text.starts_with('0')
        && text.bytes().all(|b| b.is_ascii_digit())
        && text.parse::<u32>().is_ok_and(|n| (1..=MAX_SHARDS).contains(&n))
}

/// `(name, k)` when `key` is shaped like shard `k` of a sharded stream `name`.
fn parse_shard_key(key: &str) -> Option<(&str, u32)> {
    let (name, rest) = key.split_once(":{")?;
    let index = rest.strip_prefix(name)?.strip_prefix(':')?.strip_suffix('}')?;
    let shard: u32 = index.parse().ok()?;
    (shard_key(name, shard) == key).then_some((name, shard))
}

/// The key of shard `k` of the sharded stream `name`: `<name>:{<name>:<k>}`.
pub fn shard_key(name: &str, k: u32) -> String {
    format!("{name}:{{{name}:{k}}}")
}

/// The hash tag of `key` as Redis Cluster reads it: the text between the first
/// `{` and the next `}`, when not empty.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')?;
    Some(&key[open + 1..open + 1 + close]).filter(|tag| !tag.is_empty())
}

/// FNV-1a, 64 bits: a stable, documented hash any client can reproduce.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Parses `--sharded-streams`: `name=shards[,name=shards…]`, each name once,
/// without `{` or `}` (the shard keys carry their own tags), 1 to
/// [`MAX_SHARDS`] shards.
pub fn parse_sharded(text: &str) -> Result<BTreeMap<String, u32>, String> {
    let mut sharded = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|item| !item.is_empty()) {
        let (name, count) =
            item.split_once('=').ok_or_else(|| format!("`{item}`: expected name=shards, e.g. orders=4"))?;
        let name = name.trim();
        if name.is_empty() || name.contains(['{', '}']) {
            return Err(format!("`{name}`: a sharded stream's name must be non-empty and without `{{` or `}}`"));
        }
        let count: u32 = count
            .trim()
            .parse()
            .ok()
            .filter(|n| (1..=MAX_SHARDS).contains(n))
            .ok_or_else(|| format!("`{item}`: the shard count must be a whole number from 1 to {MAX_SHARDS}"))?;
        if sharded.insert(name.to_owned(), count).is_some() {
            return Err(format!("`{name}` is named twice"));
        }
    }
    Ok(sharded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sharded(text: &str, cluster: bool) -> Keyspace {
        Keyspace::new(cluster, parse_sharded(text).unwrap())
    }

    #[test]
    fn derived_keys_share_the_stream_slot_on_a_cluster() {
        let single = sharded("", false);
        assert_eq!(single.dead_letter_stream("orders"), "orders:dlq");
        assert_eq!(single.retries("orders", "g"), "orders:retries:g");
        assert_eq!(single.keys("orders", "g"), "orders:keys:g");
        assert!(single.group_keys("orders", "g").contains(&"orders:keys:g".to_owned()), "DestroyGroup removes it");
        let cluster = sharded("", true);
        for stream in ["orders", "{orders}", "a{b}c", "orders:{orders:3}", "a{b"] {
            let dlq = cluster.dead_letter_stream(stream);
            assert_eq!(Slot::for_key(stream), Slot::for_key(&dlq), "{stream} -> {dlq}");
            for key in cluster.group_keys(stream, "g") {
                assert_eq!(Slot::for_key(stream), Slot::for_key(&key), "{stream} -> {key}");
            }
            assert_eq!(Slot::for_key(stream), Slot::for_key(cluster.fold_lease(stream)), "{stream}");
            assert_eq!(Slot::for_key(stream), Slot::for_key(cluster.archive_through(stream)), "{stream}");
            for key in [cluster.scheduled(stream), cluster.scheduled_entries(stream), cluster.scheduled_lease(stream)] {
                assert_eq!(Slot::for_key(stream), Slot::for_key(&key), "{stream} -> {key}");
            }
            for dedup_key in ["k", "{other}", "}{x}"] {
                let record = cluster.dedup(stream, dedup_key);
                assert_eq!(Slot::for_key(stream), Slot::for_key(&record), "{stream} {dedup_key} -> {record}");
            }
            assert!(cluster.same_slot("f", stream, &dlq).is_ok());
        }
        for stream in ["echomq", "echomq:index", "echomq:scheduled-index"] {
            let single = sharded("", false);
            let derived = [single.scheduled(stream), single.scheduled_entries(stream), single.scheduled_lease(stream)];
            assert!(!derived.contains(&SCHEDULED_INDEX.to_owned()), "{stream}: {derived:?}");
        }
        assert_eq!(cluster.dead_letter_stream("orders"), "{orders}:dlq");
        assert_eq!(cluster.keys("orders", "g"), "{orders}:keys:g");
        for stream in ["orders", "{orders}", "a{b}c"] {
            let keyed = cluster.keys(stream, "g{x}");
            assert_eq!(
                Slot::for_key(stream),
                Slot::for_key(&keyed),
                "{stream} -> {keyed}: the gate's keys share a slot"
            );
        }
        assert_eq!(cluster.dedup("orders", "k"), "{orders}:dedup:k");
        assert_eq!(single.dedup("orders", "k"), "orders:dedup:k");
        assert_eq!(cluster.dead_letter_stream("{orders}"), "{orders}:dlq");
        assert!(cluster.same_slot("f", "orders", "elsewhere").is_err());
        // Names that no wrapping can co-locate are refused, not sent to fail with CROSSSLOT.
        for odd in ["x{}y", "a}b"] {
            assert!(cluster.same_slot("f", odd, &cluster.dead_letter_stream(odd)).is_err(), "{odd}");
            assert!(cluster.consumable("f", odd).is_err(), "{odd}");
            assert!(single.consumable("f", odd).is_ok(), "{odd}");
        }
        for fine in ["orders", "{orders}", "a{b}c", "orders:{orders:3}"] {
            assert!(cluster.consumable("f", fine).is_ok(), "{fine}");
        }
        assert!(single.same_slot("f", "orders", "elsewhere").is_ok());
    }

    #[test]
    fn partition_keys_pick_stable_shards_and_no_key_goes_round() {
        let keys = sharded("orders=4", false);
        let first = keys.append_target("orders", b"customer-7");
        assert_eq!(first.shards, 4);
        assert_eq!(first.key, shard_key("orders", first.shard));
        for _ in 0..10 {
            assert_eq!(keys.append_target("orders", b"customer-7"), first);
        }
        let turns: Vec<u32> = (0..8).map(|_| keys.append_target("orders", b"").shard).collect();
        assert_eq!(turns, [0, 1, 2, 3, 0, 1, 2, 3], "each sharded stream takes its shards in turn");
        assert_eq!(keys.append_target("plain", b"k"), AppendTarget { key: "plain".into(), shard: 0, shards: 1 });
        // A shard key named directly keeps its shard's stride.
        let direct = keys.append_target("orders:{orders:2}", b"");
        assert_eq!((direct.shard, direct.shards), (2, 4));
        assert_eq!(keys.append_target("orders:{orders:9}", b"").shards, 1);
        assert!(keys.shard_key_check("f", "orders:{orders:9}").is_err(), "out of the configured range");
        assert_eq!(keys.shard_key_check("f", "orders:{orders:3}").ok(), Some(None));
        assert_eq!(keys.shard_key_check("f", "other:{other:0}").ok(), Some(Some("other")), "to look up in Redis");
        assert_eq!(keys.shard_key_check("f", "other:{other:x}").ok(), Some(None), "not shaped like a shard key");
        assert_eq!(keys.shard_key_check("f", "plain").ok(), Some(None));
        for count in ["1", "4", "1024"] {
            assert!(is_recorded_count(count), "{count}");
        }
        for not_a_count in ["0", "007", "+5", "1025", "99999999999", "", "abc", " 4"] {
            assert!(!is_recorded_count(not_a_count), "{not_a_count:?}");
        }
        assert_eq!(keys.shard_count_key("orders"), "orders:shards");
        assert_eq!(sharded("orders=4", true).shard_count_key("orders"), "{orders}:shards");
        let cluster = sharded("orders=4", true);
        assert_eq!(cluster.shard_count_key_to_check("orders").as_deref(), Some("{orders}:shards"));
        assert_eq!(cluster.shard_count_key_to_check("{orders}"), None, "a tagged plain stream is never sharded");
        assert_eq!(cluster.shard_count_key_to_check("orders:{orders:1}"), None);
        assert_eq!(keys.shards("orders").unwrap()[3], "orders:{orders:3}");
        assert_eq!(keys.sharded_stream_of("orders:{orders:3}"), "orders");
        assert_eq!(keys.sharded_stream_of("plain"), "plain");
        assert!(keys.shards("plain").is_none());
    }

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn sharded_streams_are_parsed_strictly() {
        assert_eq!(parse_sharded("a=2, b=1").unwrap().len(), 2);
        assert!(parse_sharded("").unwrap().is_empty());
        for bad in ["a", "a=0", "a=1025", "a=x", "{a}=2", "=2", "a=2,a=3"] {
            assert!(parse_sharded(bad).is_err(), "{bad}");
        }
    }
}
