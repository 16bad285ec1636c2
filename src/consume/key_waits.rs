//! The entries that wait for their key on this sidecar (per-key limits, see
//! [`super::keyed`]), by key, each key's in stream order: what the ledger
//! puts through the gate again, a few per key.

use std::collections::{BTreeMap, HashMap};

use super::{delivery::Outgoing, keyed::prefix};
use crate::id::StreamId;

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
    use crate::{consume::keyed::member, id::BrandedId};

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
