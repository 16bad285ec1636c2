//! Per-key limits (`Subscribe.key_field`, `max_in_flight_per_key`): the
//! names the scripts share, the gate's Redis step, and the bookkeeping of
//! entries that wait for their key.
//!
//! - **The state** is one sorted set per group, `<stream>:keys:<group>`
//!   ([`crate::keys::Keyspace::keys`]), every score 0. A member is
//!   [`member`]: `<key length>:<key bytes>:<ms>-<seq>`, the stream id's two
//!   parts zero-padded to 20 digits, so `ZRANGEBYLEX` over one key's prefix
//!   lists that key's entries in stream order, and the length prefix keeps a
//!   key holding `:` or `\0` from reading as another. The set mirrors the
//!   group's PEL for keyed entries: `keyed_read.lua` adds an entry in the
//!   same step as the `XREADGROUP` that takes it, and the step that takes it
//!   out of the PEL through this sidecar (`settle.lua`, `dead_letter.lua`,
//!   `ack_emit.lua`) removes it.
//! - **The gate** (`key_gate.lua`, run by `keyed_read.lua` on what it reads
//!   and by `keys_gate.lua` on entries reclaimed, retried or waiting): an
//!   entry may be handed to a call only while it is among the first
//!   `per_key` members of its key. Members ahead of it that are no longer
//!   pending (acknowledged by any client, deleted, a re-created group) are
//!   removed on the way: that lazy clean-up is what heals the set.
//! - **Waiting**: an entry the gate holds back stays in this consumer's PEL,
//!   leased like a held delivery, in [`KeyWaits`], until a later gate run
//!   lets it through.

use std::collections::{BTreeMap, HashMap};

use redis::{RedisResult, Value};

use super::{delivery::Outgoing, GroupKeys};
use crate::{
    id::StreamId,
    redis::{array, int},
};

/// The length of a member's stream id part: two 20-digit numbers and `-`.
const ID_PART: usize = 41;

/// The member of the entry `id` whose key is `key` (bytes, as stored):
/// `<key length>:<key>:<ms, 20 digits>-<seq, 20 digits>`. `keyed_read.lua`
/// builds the same bytes (`member_of` in `key_gate.lua`).
pub(crate) fn member(key: &[u8], id: StreamId) -> Vec<u8> {
    let mut member = Vec::with_capacity(key.len() + 24 + ID_PART);
    member.extend_from_slice(key.len().to_string().as_bytes());
    member.push(b':');
    member.extend_from_slice(key);
    member.extend_from_slice(format!(":{:020}-{:020}", id.ms, id.seq).as_bytes());
    member
}

/// The key's part of `member` (`<length>:<key>:`), shared by all its entries.
pub(crate) fn prefix(member: &[u8]) -> &[u8] {
    &member[..member.len().saturating_sub(ID_PART)]
}

/// The key and the stream id of a member; `None` when `member` is not
/// shaped as [`member`] makes them (written by hand, say).
pub(crate) fn parse_member(member: &[u8]) -> Option<(&[u8], StreamId)> {
    let colon = member.iter().position(|&b| b == b':')?;
    let len: usize = std::str::from_utf8(&member[..colon]).ok()?.parse().ok()?;
    let rest = &member[colon + 1..];
    if rest.len() != len + 1 + ID_PART || rest[len] != b':' {
        return None;
    }
    let id = std::str::from_utf8(&rest[len + 1..]).ok()?;
    let (ms, seq) = id.split_once('-')?;
    if !(ms.len() == 20 && seq.len() == 20 && ms.bytes().chain(seq.bytes()).all(|b| b.is_ascii_digit())) {
        return None;
    }
    Some((&rest[..len], StreamId { ms: ms.parse().ok()?, seq: seq.parse().ok()? }))
}

/// The key of an entry: the value of its first field named `field` (as
/// `keyed_read.lua` takes it); `None`: the entry is not limited.
pub(crate) fn key_of<'a>(fields: &'a [(Vec<u8>, Vec<u8>)], field: &str) -> Option<&'a [u8]> {
    fields.iter().find(|(name, _)| name == field.as_bytes()).map(|(_, value)| value.as_slice())
}

/// What the gate (`keys_gate.lua`) said of an entry this sidecar held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Checked {
    /// Among its key's first `per_key` entries: it may run now.
    Admitted,
    /// Its key is at its limit: it waits.
    Waits,
    /// No longer pending for this consumer: a peer took it (this sidecar was
    /// paused past the reclaim idle time) or it left the PEL. Forget it.
    Gone,
}

/// Runs the gate (`keys_gate.lua`: per candidate XPENDING, fenced to this
/// sidecar's consumer; then ZSCORE, ZADD when missing, ZRANGEBYLEX over its
/// key's first `per_key` members, XPENDING and ZREM of those no longer
/// pending) on `candidates` (stream id, member), in order.
///
/// Errors: Redis' (WRONGTYPE when the keyed-entries key holds another
/// type; NOGROUP when the group is gone), or a reply not shaped as the
/// script's (a Parse error).
pub(crate) async fn gate(
    keys: &GroupKeys,
    per_key: u32,
    candidates: &[(StreamId, Vec<u8>)],
) -> RedisResult<Vec<Checked>> {
    let mut script = keys.redis.scripts.keys_gate.prepare_invoke();
    script.key(&keys.stream).key(&keys.keyed).arg(&keys.group).arg(per_key).arg(&keys.consumer);
    for (_, member) in candidates {
        script.arg(member.as_slice());
    }
    let mut conn = keys.redis.conn.clone();
    let reply: Value = script.invoke_async(&mut conn).await?;
    let malformed =
        |what: String| redis::RedisError::from((redis::ErrorKind::Parse, "unexpected reply from Redis", what));
    let checked: Vec<Checked> = array(&reply)
        .iter()
        .map(|flag| match int(flag)? {
            1 => Ok(Checked::Admitted),
            0 => Ok(Checked::Waits),
            -1 => Ok(Checked::Gone),
            other => Err(malformed(format!("keys_gate.lua answered {other}"))),
        })
        .collect::<RedisResult<_>>()?;
    if checked.len() != candidates.len() {
        return Err(malformed(format!("keys_gate.lua answered {} of {} candidates", checked.len(), candidates.len())));
    }
    Ok(checked)
}

/// What the gate said of an entry read by `keyed_read.lua`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// The entry has no key field: not limited.
    Unkeyed,
    /// Among its key's first `per_key` entries: it may run now.
    Admitted,
    /// Its key is at its limit: it waits.
    Waits,
}

impl Gate {
    /// The script's flag: 0 no key, 1 admitted, 2 waits.
    pub(crate) fn from_flag(flag: i64) -> Option<Gate> {
        match flag {
            0 => Some(Gate::Unkeyed),
            1 => Some(Gate::Admitted),
            2 => Some(Gate::Waits),
            _ => None,
        }
    }
}

/// Entries that wait for their key, by key, each key's in stream order.
/// Every entry here has a member ([`Outgoing::member`]).
pub(crate) struct KeyWaits<D> {
    /// Key prefix ([`prefix`]) → its waiting entries by stream id.
    by_key: HashMap<Vec<u8>, BTreeMap<StreamId, Outgoing<D>>>,
    /// Stream id → its key prefix, to find an entry by id alone.
    key_of: HashMap<StreamId, Vec<u8>>,
}

impl<D> Default for KeyWaits<D> {
    fn default() -> Self {
        KeyWaits { by_key: HashMap::new(), key_of: HashMap::new() }
    }
}

impl<D> KeyWaits<D> {
    /// Entries waiting (entries).
    pub(crate) fn len(&self) -> usize {
        self.key_of.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.key_of.is_empty()
    }

    /// Whether `stream_id` waits here.
    #[cfg(test)]
    pub(crate) fn contains(&self, stream_id: StreamId) -> bool {
        self.key_of.contains_key(&stream_id)
    }

    /// Whether entries of the key with prefix `key` wait here.
    pub(crate) fn has_key(&self, key: &[u8]) -> bool {
        self.by_key.contains_key(key)
    }

    /// Adds `out` (which has a member; one without is given back).
    pub(crate) fn insert(&mut self, out: Outgoing<D>) -> Result<(), Outgoing<D>> {
        let Some(member) = &out.member else { return Err(out) };
        let key = prefix(member).to_vec();
        if let Some(old) = self.key_of.insert(out.stream_id, key.clone()) {
            // The same entry again (a re-created group read it anew): the new copy replaces it.
            self.take_from(&old, out.stream_id);
        }
        self.by_key.entry(key).or_default().insert(out.stream_id, out);
        Ok(())
    }

    /// Takes `stream_id` out, if it waits here.
    pub(crate) fn remove(&mut self, stream_id: StreamId) -> Option<Outgoing<D>> {
        let key = self.key_of.remove(&stream_id)?;
        self.take_from(&key, stream_id)
    }

    fn take_from(&mut self, key: &[u8], stream_id: StreamId) -> Option<Outgoing<D>> {
        let entries = self.by_key.get_mut(key)?;
        let out = entries.remove(&stream_id);
        if entries.is_empty() {
            self.by_key.remove(key);
        }
        out
    }

    /// What to put through the gate: each key's first `per_key` waiting
    /// entries (a later one cannot pass while those wait), of the keys
    /// `only` names (all when `None`), at most `max` in all.
    pub(crate) fn candidates(&self, per_key: u32, only: Option<&[Vec<u8>]>, max: usize) -> Vec<(StreamId, Vec<u8>)> {
        let heads = |entries: &BTreeMap<StreamId, Outgoing<D>>| {
            entries
                .values()
                .take(per_key as usize)
                .filter_map(|out| Some((out.stream_id, out.member.clone()?)))
                .collect::<Vec<_>>()
        };
        let mut out = Vec::new();
        match only {
            Some(keys) => {
                for key in keys {
                    out.extend(self.by_key.get(key).map(heads).unwrap_or_default());
                }
            }
            None => {
                for entries in self.by_key.values() {
                    out.extend(heads(entries));
                    if out.len() >= max {
                        break;
                    }
                }
            }
        }
        out.truncate(max);
        out
    }

    /// Takes every waiting entry out, in no particular order.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = Outgoing<D>> + '_ {
        self.key_of.clear();
        self.by_key.drain().flat_map(|(_, entries)| entries.into_values())
    }

    /// The waiting entries' stream ids.
    #[cfg(test)]
    pub(crate) fn ids(&self) -> impl Iterator<Item = StreamId> + '_ {
        self.key_of.keys().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::BrandedId;

    fn sid(ms: u64, seq: u64) -> StreamId {
        StreamId { ms, seq }
    }

    fn out(key: &[u8], ms: u64) -> Outgoing<()> {
        let stream_id = sid(ms, 0);
        Outgoing {
            stream_id,
            branded: BrandedId::from_stream_id(stream_id).unwrap(),
            attempts: 1,
            member: Some(member(key, stream_id)),
            body: (),
        }
    }

    #[test]
    fn members_sort_by_key_then_stream_order_and_parse_back() {
        let a = member(b"acct", sid(9, 0));
        assert_eq!(a, b"4:acct:00000000000000000009-00000000000000000000".to_vec());
        let later = member(b"acct", sid(10, 0));
        let seq_later = member(b"acct", sid(9, u64::MAX));
        assert!(a < later && a < seq_later && seq_later < later, "byte order is stream order within a key");
        assert_eq!(parse_member(&seq_later), Some((&b"acct"[..], sid(9, u64::MAX))));
        assert_eq!(prefix(&a), b"4:acct:");
        // A key with ':' (or any byte) never reads as another key's prefix.
        let odd = member(b"a:1:x\0", sid(1, 2));
        assert_eq!(parse_member(&odd), Some((&b"a:1:x\0"[..], sid(1, 2))));
        assert_ne!(prefix(&odd), prefix(&member(b"a", sid(1, 2))));
        assert!(!prefix(&member(b"ab", sid(1, 0))).starts_with(prefix(&member(b"a", sid(1, 0)))));
        for bad in [&b""[..], b"x", b"4:acct", b"4:acc:00000000000000000009-00000000000000000000", b"4:acct:9-0"] {
            assert_eq!(parse_member(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn the_key_is_the_first_field_of_that_name() {
        let fields = vec![(b"k".to_vec(), b"1".to_vec()), (b"k".to_vec(), b"2".to_vec())];
        assert_eq!(key_of(&fields, "k"), Some(&b"1"[..]));
        assert_eq!(key_of(&fields, "other"), None);
    }

    #[test]
    fn waits_offer_each_keys_first_entries_and_forget_what_leaves() {
        let mut waits = KeyWaits::default();
        for (key, ms) in [(&b"a"[..], 3), (b"a", 1), (b"a", 2), (b"b", 5)] {
            waits.insert(out(key, ms)).unwrap();
        }
        let no_member = Outgoing { member: None, ..out(b"c", 9) };
        assert!(waits.insert(no_member).is_err(), "an entry without a key never waits");
        assert_eq!(waits.len(), 4);
        let mut first: Vec<StreamId> = waits.candidates(1, None, 100).into_iter().map(|(id, _)| id).collect();
        first.sort();
        assert_eq!(first, [sid(1, 0), sid(5, 0)], "one per key, the oldest");
        let a = prefix(&member(b"a", sid(0, 0))).to_vec();
        let two: Vec<StreamId> =
            waits.candidates(2, Some(std::slice::from_ref(&a)), 100).into_iter().map(|(id, _)| id).collect();
        assert_eq!(two, [sid(1, 0), sid(2, 0)]);
        assert_eq!(waits.candidates(5, None, 1).len(), 1, "at most max");
        assert_eq!(waits.remove(sid(1, 0)).map(|o| o.stream_id), Some(sid(1, 0)));
        assert!(waits.remove(sid(1, 0)).is_none());
        waits.insert(out(b"a", 2)).unwrap();
        assert_eq!(waits.len(), 3, "the same entry again replaces it");
        waits.remove(sid(2, 0));
        waits.remove(sid(3, 0));
        assert!(!waits.has_key(&a), "a key with nothing waiting is gone");
        assert_eq!(waits.drain().count(), 1);
        assert!(waits.is_empty() && waits.ids().next().is_none());
    }
}
