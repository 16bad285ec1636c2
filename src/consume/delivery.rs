//! Turning a Redis entry into a `Delivery` frame, and the span of a
//! delivery handed over.

use std::sync::Arc;

use bytes::Bytes;

use super::keyed;
use crate::{
    entry,
    id::{BrandedId, StreamId},
    telemetry,
    wire::{Origin, OutgoingDelivery},
};

/// An entry ready to hand over: its ids, its delivery count and its
/// contents `D` (the delivery, boxed once when it is built: it moves
/// through the ledger, its effects and the call's channel as a pointer, and
/// an idle call's channel keeps room for 32 events of a pointer each; the
/// ledger never looks inside).
#[derive(Debug)]
pub(crate) struct Outgoing<D = Box<OutgoingDelivery>> {
    /// The entry's stream id.
    pub(crate) stream_id: StreamId,
    /// The entry's branded id (the reserved field, else derived from `stream_id`).
    pub(crate) branded: BrandedId,
    /// Its PEL delivery count, this delivery included.
    pub(crate) attempts: u32,
    /// Its member in the group's keyed entries (see [`super::keyed`]):
    /// `None` unless the group has a key field and the entry holds it.
    pub(crate) member: Option<Vec<u8>>,
    /// The frame, `attempts` filled in.
    pub(crate) body: D,
}

/// Builds the delivery of `fields` (see [`entry::split`]), with its member
/// when the group has a `key_field` and the entry holds it. `None` when the
/// entry has no branded id: no valid reserved field and a stream id whose
/// milliseconds do not fit 6 bytes.
///
/// The payload's values are the `fields`' own bytes, usually slices of the
/// Redis reply the entry came in, which they keep allocated while the
/// delivery lives: a delivery waits at most for its call's credit. An entry
/// with a member may wait for its key for as long as the key's earlier
/// entries are in flight, up to thousands per group, one per reply at
/// worst: its values are copied out, so a waiting entry keeps its own bytes
/// and not a reply's 64 KiB.
pub(crate) fn build(
    origin: &Arc<Origin>,
    id_field: &str,
    key_field: Option<&str>,
    stream_id: StreamId,
    fields: Vec<(Bytes, Bytes)>,
    attempts: u32,
) -> Option<Outgoing> {
    let member = key_field.and_then(|field| keyed::key_of(&fields, field)).map(|key| keyed::member(key, stream_id));
    let fields = entry::split::<Bytes>(fields, id_field, |_| false);
    let branded = fields.branded.or_else(|| BrandedId::from_stream_id(stream_id))?;
    let mut delivery = OutgoingDelivery::new(
        branded,
        stream_id,
        Arc::clone(origin),
        fields.payload,
        attempts,
        fields.traceparent.unwrap_or_default(),
        fields.raw_fields,
    );
    if member.is_some() {
        delivery.own_payload();
    }
    Some(Outgoing { stream_id, branded, attempts, member, body: Box::new(delivery) })
}

/// The span of one delivery, from hand-over to verdict, child of the trace
/// context the entry carries; the delivery then carries the span's own. Kind
/// CONSUMER, operation `process`: the sidecar pushes the entry to its client,
/// and the span lasts while the client processes it.
pub(crate) fn span(stream: &str, group: &str, stream_id: StreamId, delivery: &mut OutgoingDelivery) -> tracing::Span {
    let span = tracing::info_span!(
        "echomq.deliver",
        otel.kind = "consumer",
        messaging.system = telemetry::MESSAGING_SYSTEM,
        messaging.operation.type = "process",
        messaging.operation.name = "deliver",
        messaging.destination.name = stream,
        messaging.consumer.group.name = group,
        messaging.message.id = %delivery.branded(),
        echomq.stream_id = %stream_id,
        echomq.attempts = delivery.attempts(),
        echomq.verdict = tracing::field::Empty,
    );
    telemetry::set_parent(&span, Some(delivery.traceparent()).filter(|t| !t.is_empty()));
    if let Some(traceparent) = telemetry::traceparent_of(&span) {
        delivery.set_traceparent(traceparent);
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &'static [u8], value: &'static [u8]) -> (Bytes, Bytes) {
        (Bytes::from_static(name), Bytes::from_static(value))
    }

    fn sid(ms: u64, seq: u64) -> StreamId {
        StreamId { ms, seq }
    }

    fn origin() -> Arc<Origin> {
        Arc::new(Origin { stream: "s".into(), group: "g".into() })
    }

    /// The delivery as the client decodes it.
    fn sent(out: &Outgoing) -> crate::proto::Delivery {
        (*out.body).clone().into_proto()
    }

    #[test]
    fn reserved_field_gives_the_branded_id_and_leaves_the_payload() {
        let copy_of = BrandedId::from_stream_id(sid(1_000, 7)).unwrap();
        let fields = vec![(Bytes::from_static(b"id"), Bytes::from(copy_of.to_string())), field(b"k", b"v")];
        let out = build(&origin(), "id", None, sid(2_000, 0), fields, 3).unwrap();
        assert_eq!(out.branded, copy_of);
        let body = sent(&out);
        assert_eq!(body.stream_id, "2000-0");
        assert_eq!((body.stream.as_str(), body.group.as_str()), ("s", "g"));
        assert_eq!(body.payload.len(), 1);
        assert_eq!(body.attempts, 3);
        assert_eq!(body.minted_at.unwrap().seconds, 1);
        assert_eq!(out.member, None, "no key field: no member");
    }

    #[test]
    fn an_entry_that_may_wait_for_its_key_keeps_its_own_bytes_not_the_reply() {
        let reply = Bytes::from(b"acct a:1 v x".to_vec());
        let fields = vec![(reply.slice(0..4), reply.slice(5..8)), (reply.slice(9..10), reply.slice(11..12))];
        let in_reply = |value: &Bytes| reply.as_ptr_range().contains(&value.as_ptr());
        let out = build(&origin(), "id", None, sid(5, 1), fields.clone(), 1).unwrap();
        assert!(in_reply(&out.body.payload()[1].1), "no key: the value is a slice of the reply");
        let out = build(&origin(), "id", Some("acct"), sid(5, 1), fields, 1).unwrap();
        assert!(out.body.payload().iter().all(|(_, value)| !in_reply(value)), "a keyed entry copies its values");
        assert_eq!(sent(&out).payload["acct"], &b"a:1"[..]);
        assert_eq!(sent(&out).payload["v"], &b"x"[..]);
    }

    #[test]
    fn an_entry_with_the_key_field_gets_its_member() {
        let fields = vec![field(b"acct", b"a:1"), field(b"v", b"x")];
        let out = build(&origin(), "id", Some("acct"), sid(5, 1), fields.clone(), 1).unwrap();
        assert_eq!(out.member, Some(keyed::member(b"a:1", sid(5, 1))));
        assert_eq!(sent(&out).payload["acct"], &b"a:1"[..], "the key stays in the payload");
        let out = build(&origin(), "id", Some("other"), sid(5, 1), fields, 1).unwrap();
        assert_eq!(out.member, None, "an entry without the field is not limited");
    }

    #[test]
    fn foreign_entries_derive_their_id_and_keep_a_bogus_id_field_as_payload() {
        let fields = vec![field(b"id", b"order-42")];
        let out = build(&origin(), "id", None, sid(5, 1), fields, 1).unwrap();
        assert_eq!(sent(&out).id, "0000000000050000000000000001");
        assert_eq!(sent(&out).payload["id"], &b"order-42"[..]);
    }

    #[test]
    fn non_utf8_and_repeated_names_go_to_raw_fields() {
        let fields = vec![field(b"\xffname", b"\x00\x01"), field(b"k", b"1"), field(b"k", b"2")];
        let out = build(&origin(), "id", None, sid(5, 1), fields, 1).unwrap();
        assert_eq!(sent(&out).payload["k"], &b"1"[..]);
        let raw: Vec<_> = sent(&out).raw_fields.iter().map(|f| (f.name.clone(), f.value.clone())).collect();
        assert_eq!(raw, vec![(b"\xffname".to_vec(), b"\x00\x01".to_vec()), (b"k".to_vec(), b"2".to_vec())]);
    }
}
