//! The AckEmit's emits, checked at the edge before anything reaches Redis:
//! every bad emit gets a verdict error naming it, and nothing is written (the
//! call still holds the delivery, and may answer it again).

use std::sync::Arc;

use redis::cluster_routing::Slot;

use super::{orders::NewEmit, verdicts::Refusal};
use crate::{
    error::Error,
    keys::Keyspace,
    proto::Emit,
    security::{Caller, Guard},
};

/// The most emits one AckEmit may carry.
pub(crate) const MAX_EMITS: usize = 1000;
/// What a delivery frame of an emitted entry adds to its fields and stream
/// name (bytes): the branded id, stream id, group, attempts, minted_at, a
/// traceparent, and the protobuf framing around them. A generous estimate:
/// the check is there so that an emit no consumer could receive is refused
/// now, rather than dead-lettered on its first delivery.
const DELIVERY_OVERHEAD: usize = 256;
/// What each field adds to a delivery frame besides its name and value (bytes).
const FIELD_OVERHEAD: usize = 8;

/// The rules one Consume call's AckEmits are checked against.
pub(crate) struct EmitRules {
    pub(crate) guard: Guard,
    /// The caller, for the allow-list.
    pub(crate) caller: Option<Caller>,
    pub(crate) keys: Arc<Keyspace>,
    /// The reserved branded-id field (`--id-field`).
    pub(crate) id_field: String,
    /// The largest frame a client accepts (`--max-message-bytes`).
    pub(crate) max_message_bytes: usize,
}

impl EmitRules {
    /// The emits of an AckEmit of a delivery from stream key `source`, each
    /// with where it goes and its fields sorted by name.
    ///
    /// Errors (nothing written): [`Refusal::Invalid`] for more than
    /// [`MAX_EMITS`] emits, an empty or too long stream name, a sharded
    /// stream's name, a stream on another Redis Cluster slot than `source`,
    /// too many fields, the reserved field, an entry too large for a delivery
    /// frame; [`Refusal::PermissionDenied`] for a stream outside the allow-list.
    pub(crate) fn check(&self, source: &str, emits: Vec<Emit>) -> Result<Vec<NewEmit>, Refusal> {
        if emits.len() > MAX_EMITS {
            return Err(Refusal::Invalid(format!(
                "ack_emit.emits: {} emits is more than the limit of {MAX_EMITS}; nothing was written (the delivery is still held)",
                emits.len()
            )));
        }
        emits.into_iter().enumerate().map(|(at, emit)| self.check_one(source, at, emit)).collect()
    }

    fn check_one(&self, source: &str, at: usize, emit: Emit) -> Result<NewEmit, Refusal> {
        let refuse = |reason: String| {
            Refusal::Invalid(format!(
                "ack_emit.emits[{at}]: {reason}; nothing was written (the delivery is still held)"
            ))
        };
        let stream = match self.guard.stream(self.caller.as_ref(), "stream", &emit.stream) {
            Ok(stream) => stream,
            Err(e @ Error::PermissionDenied { .. }) => {
                return Err(Refusal::PermissionDenied(format!(
                    "ack_emit.emits[{at}]: {e}; nothing was written (the delivery is still held)"
                )))
            }
            Err(e) => return Err(refuse(e.to_string())),
        };
        let keys = &self.keys;
        if keys.shards(stream).is_some() {
            return Err(refuse(format!(
                "`{stream}` is a sharded stream (--sharded-streams): an AckEmit writes with its source in one \
                 script, so it names one shard key, `{}` for shard 0, on the source's slot",
                crate::keys::shard_key(stream, 0)
            )));
        }
        keys.shard_key_check("stream", stream).map_err(|e| refuse(e.to_string()))?;
        keys.consumable("stream", stream).map_err(|e| refuse(e.to_string()))?;
        if keys.is_cluster() && Slot::for_key(stream) != Slot::for_key(source) {
            return Err(refuse(format!(
                "`{stream}` and the delivery's stream `{source}` hash to different Redis Cluster slots, and an \
                 AckEmit writes both in one script: give both names one {{hash tag}} (e.g. `{{orders}}:in` and \
                 `{{orders}}:out`)"
            )));
        }
        if emit.fields.contains_key(&self.id_field) {
            return Err(refuse(format!(
                "`{}` is the reserved field that carries the branded id; rename the field",
                self.id_field
            )));
        }
        if emit.fields.len() > self.guard.max_fields_per_entry {
            return Err(refuse(format!(
                "{} fields is more than this sidecar's limit of {} (--max-fields-per-entry)",
                emit.fields.len(),
                self.guard.max_fields_per_entry
            )));
        }
        let size = DELIVERY_OVERHEAD
            + stream.len()
            + emit.fields.iter().map(|(name, value)| name.len() + value.len() + FIELD_OVERHEAD).sum::<usize>();
        if size > self.max_message_bytes {
            return Err(refuse(format!(
                "its delivery frame would be about {size} bytes, over this sidecar's --max-message-bytes ({}), so \
                 no consumer could receive it; make it smaller",
                self.max_message_bytes
            )));
        }
        let target = keys.append_target(stream, b"");
        let mut fields: Vec<(String, Vec<u8>)> = emit.fields.into_iter().collect();
        fields.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok(NewEmit { stream: target.key, shard: target.shard, shards: target.shards, fields })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;
    use crate::security::Gate;

    fn rules(cluster: bool, allow: &[&str]) -> EmitRules {
        let gate = Gate::new(None, allow.iter().map(|p| (*p).to_owned()).collect(), HashMap::new());
        let sharded = BTreeMap::from([("sharded".to_owned(), 2)]);
        EmitRules {
            guard: Guard::new(gate, 64, 4, 1024),
            caller: None,
            keys: Arc::new(Keyspace::new(cluster, sharded)),
            id_field: "id".to_owned(),
            max_message_bytes: 1024,
        }
    }

    fn emit(stream: &str, fields: &[(&str, &[u8])]) -> Emit {
        Emit {
            stream: stream.to_owned(),
            fields: fields.iter().map(|(name, value)| ((*name).to_owned(), value.to_vec())).collect(),
        }
    }

    fn invalid(result: Result<Vec<NewEmit>, Refusal>, says: &str) {
        match result {
            Err(Refusal::Invalid(message)) => assert!(message.contains(says), "{message} does not say {says}"),
            other => panic!("expected INVALID_ARGUMENT saying {says}, got {other:?}"),
        }
    }

    #[test]
    fn good_emits_keep_their_order_and_sort_their_fields() {
        let emits = vec![emit("out", &[("b", b"2"), ("a", b"1")]), emit("sharded:{sharded:1}", &[])];
        let checked = rules(false, &[]).check("in", emits).unwrap();
        assert_eq!(checked[0].stream, "out");
        assert_eq!((checked[0].shard, checked[0].shards), (0, 1));
        assert_eq!(checked[0].fields, vec![("a".to_owned(), b"1".to_vec()), ("b".to_owned(), b"2".to_vec())]);
        assert_eq!((checked[1].shard, checked[1].shards), (1, 2), "a shard key mints with its shard's stride");
    }

    #[test]
    fn each_bad_emit_is_refused_naming_what_is_wrong() {
        let r = rules(false, &[]);
        invalid(r.check("in", vec![emit("", &[])]), "emits[0]: stream: required");
        invalid(r.check("in", vec![emit("out", &[]), emit(&"x".repeat(65), &[])]), "emits[1]: stream: 65 bytes");
        invalid(r.check("in", vec![emit("out", &[("id", b"x")])]), "reserved field");
        let many: Vec<(&str, &[u8])> = vec![("a", b""), ("b", b""), ("c", b""), ("d", b""), ("e", b"")];
        invalid(r.check("in", vec![emit("out", &many)]), "5 fields is more than");
        invalid(r.check("in", vec![emit("out", &[("a", &[0u8; 900])])]), "--max-message-bytes");
        invalid(r.check("in", vec![emit("sharded", &[])]), "sharded stream");
        invalid(r.check("in", vec![emit("sharded:{sharded:7}", &[])]), "not a shard");
        invalid(r.check("in", (0..=MAX_EMITS).map(|_| emit("out", &[])).collect()), "more than the limit");
    }

    #[test]
    fn a_stream_outside_the_allow_list_is_permission_denied() {
        let result = rules(false, &["in", "out:*"]).check("in", vec![emit("out:a", &[]), emit("elsewhere", &[])]);
        match result {
            Err(Refusal::PermissionDenied(message)) => assert!(message.contains("emits[1]"), "{message}"),
            other => panic!("expected PERMISSION_DENIED, got {other:?}"),
        }
    }

    #[test]
    fn on_a_cluster_an_emit_must_share_the_source_slot() {
        let r = rules(true, &[]);
        assert!(r.check("{orders}:in", vec![emit("{orders}:out", &[])]).is_ok());
        invalid(r.check("{orders}:in", vec![emit("payments", &[])]), "different Redis Cluster slots");
        assert!(rules(false, &[]).check("{orders}:in", vec![emit("payments", &[])]).is_ok(), "one server: any stream");
    }
}
