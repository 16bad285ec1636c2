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
//!   leased like a held delivery, in [`super::key_waits::KeyWaits`], until a
//!   later gate run lets it through.

use bytes::Bytes;
use redis::{RedisResult, Value};

use super::GroupKeys;
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
pub(crate) fn key_of<'a>(fields: &'a [(Bytes, Bytes)], field: &str) -> Option<&'a [u8]> {
    fields.iter().find(|(name, _)| name == field.as_bytes()).map(|(_, value)| &value[..])
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sid(ms: u64, seq: u64) -> StreamId {
        StreamId { ms, seq }
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
        let fields = [
            (Bytes::from_static(b"k"), Bytes::from_static(b"1")),
            (Bytes::from_static(b"k"), Bytes::from_static(b"2")),
        ];
        assert_eq!(key_of(&fields, "k"), Some(&b"1"[..]));
        assert_eq!(key_of(&fields, "other"), None);
    }
}
