//! The delivery frames as the sidecar writes them: [`OutgoingDelivery`]
//! encodes as an `echomq.v1.Delivery`, and [`DeliveryBatch`] (the generated
//! code's `echomq.v1.DeliveryBatch`, by `extern_path` in `build.rs`) carries
//! either kind.
//!
//! Why not the generated `Delivery`: its strings and map are allocations of
//! their own. A delivery built as one owned the branded id's and the stream
//! id's text, copies of the stream and group names, a hash map with a `String`
//! per field name: seven of the ten allocations per entry callgrind counted
//! on the consume path, where glibc's `malloc` and `free` were 28% of the
//! sidecar's instructions. Here the ids are written as text straight into the
//! frame, the names are shared by the worker's deliveries, and the payload's
//! names and values are slices of the Redis reply the entry came in. The
//! encoded length is kept too: a frame's length is asked for once by the
//! worker (the frame-size limit), once by the batch and twice by the encoder.
//!
//! Clients decode the frames with the generated types: a decoded
//! [`DeliveryBatch`] holds its `deliveries` as `echomq.v1.Delivery` values.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use prost::{
    encoding::{self, encode_key, encode_varint, encoded_len_varint, key_len, DecodeContext, WireType},
    DecodeError, Message,
};

use crate::{
    entry,
    id::{BrandedId, StreamId, BRANDED_ID_LEN},
    proto::{Delivery, RawField},
};

/// The stream and group a worker's deliveries name, shared by all of them.
#[derive(Debug, PartialEq, Eq)]
pub struct Origin {
    /// The stream key.
    pub stream: String,
    /// The consumer group.
    pub group: String,
}

/// One delivery as the sidecar builds it; it encodes exactly as the
/// `echomq.v1.Delivery` of the same contents (see the module's doc for why it
/// is not that type). The payload's pairs go on the wire in stream order.
#[derive(Clone, Debug, PartialEq)]
pub struct OutgoingDelivery {
    branded: BrandedId,
    stream_id: StreamId,
    origin: Arc<Origin>,
    /// Names valid UTF-8 and each once (a proto map's keys).
    payload: Vec<(Bytes, Bytes)>,
    attempts: u32,
    traceparent: String,
    raw_fields: Vec<RawField>,
    /// [`Message::encoded_len`] of the `Delivery` it encodes as (bytes).
    len: usize,
}

impl OutgoingDelivery {
    /// A delivery of `payload` (pairs whose names are valid UTF-8, each name
    /// once: [`entry::split`]'s `payload`); `traceparent` empty for none.
    pub fn new(
        branded: BrandedId,
        stream_id: StreamId,
        origin: Arc<Origin>,
        payload: Vec<(Bytes, Bytes)>,
        attempts: u32,
        traceparent: String,
        raw_fields: Vec<RawField>,
    ) -> OutgoingDelivery {
        let mut delivery =
            OutgoingDelivery { branded, stream_id, origin, payload, attempts, traceparent, raw_fields, len: 0 };
        delivery.len = delivery.measure();
        delivery
    }

    /// The branded id, the client's idempotency key.
    pub fn branded(&self) -> BrandedId {
        self.branded
    }

    /// The delivery count, this delivery included.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The W3C trace context it carries; empty for none.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// Replaces the trace context it carries (the delivery span's own).
    pub fn set_traceparent(&mut self, traceparent: String) {
        self.traceparent = traceparent;
        self.len = self.measure();
    }

    /// The payload's pairs, names valid UTF-8, in stream order.
    pub fn payload(&self) -> &[(Bytes, Bytes)] {
        &self.payload
    }

    /// Copies the payload's values out of the buffers they are slices of
    /// (the Redis reply), so a delivery that waits long keeps only its own bytes.
    pub fn own_payload(&mut self) {
        for (name, value) in &mut self.payload {
            *name = Bytes::copy_from_slice(name);
            *value = Bytes::copy_from_slice(value);
        }
    }

    /// Its `Delivery` encoding's length without a length prefix (bytes).
    pub fn encoded_len(&self) -> usize {
        self.len
    }

    /// The generated type of the same contents, for a frame of one delivery.
    pub fn into_proto(self) -> Delivery {
        let text = |name: Bytes| String::from_utf8_lossy(&name).into_owned();
        Delivery {
            id: self.branded.to_string(),
            stream_id: self.stream_id.to_string(),
            stream: self.origin.stream.clone(),
            group: self.origin.group.clone(),
            payload: self.payload.into_iter().map(|(name, value)| (text(name), value)).collect(),
            attempts: self.attempts,
            minted_at: Some(entry::timestamp(self.branded.minted_at_ms())),
            traceparent: self.traceparent,
            raw_fields: self.raw_fields,
        }
    }

    /// The encoded length, as prost's derive would count it: proto3 leaves
    /// empty strings and zero numbers out, a map entry leaves out an empty
    /// key or value, a message field is always written.
    fn measure(&self) -> usize {
        let stream_id = self.stream_id.text_len();
        let payload: usize = self.payload.iter().map(|(name, value)| nested_len(5, map_entry_len(name, value))).sum();
        string_len(1, BRANDED_ID_LEN)
            + string_len(2, stream_id)
            + string_len(3, self.origin.stream.len())
            + string_len(4, self.origin.group.len())
            + payload
            + if self.attempts == 0 { 0 } else { key_len(6) + encoded_len_varint(u64::from(self.attempts)) }
            + encoding::message::encoded_len(7, &entry::timestamp(self.branded.minted_at_ms()))
            + string_len(8, self.traceparent.len())
            + encoding::message::encoded_len_repeated(9, &self.raw_fields)
    }

    /// Writes the fields in tag order, as prost's derive does.
    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_string(1, self.branded.write_ascii(&mut [0; BRANDED_ID_LEN]), buf);
        put_string(2, self.stream_id.write_ascii(&mut [0; 41]), buf);
        put_string(3, self.origin.stream.as_bytes(), buf);
        put_string(4, self.origin.group.as_bytes(), buf);
        for (name, value) in &self.payload {
            encode_key(5, WireType::LengthDelimited, buf);
            encode_varint(map_entry_len(name, value) as u64, buf);
            put_string(1, name, buf);
            put_string(2, value, buf);
        }
        if self.attempts != 0 {
            encoding::uint32::encode(6, &self.attempts, buf);
        }
        encoding::message::encode(7, &entry::timestamp(self.branded.minted_at_ms()), buf);
        put_string(8, self.traceparent.as_bytes(), buf);
        encoding::message::encode_repeated(9, &self.raw_fields, buf);
    }
}

/// A length-delimited field of `len` bytes, tag and length prefix included.
fn nested_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// A string or bytes field of `len` bytes: nothing when empty (proto3).
fn string_len(tag: u32, len: usize) -> usize {
    if len == 0 {
        0
    } else {
        nested_len(tag, len)
    }
}

/// A `map<string, bytes>` entry's message: key 1, value 2, each left out when empty.
fn map_entry_len(name: &[u8], value: &[u8]) -> usize {
    string_len(1, name.len()) + string_len(2, value.len())
}

/// Writes a string or bytes field; nothing when empty (proto3).
fn put_string(tag: u32, bytes: &[u8], buf: &mut impl BufMut) {
    if !bytes.is_empty() {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(bytes.len() as u64, buf);
        buf.put_slice(bytes);
    }
}

/// `echomq.v1.DeliveryBatch`: deliveries in delivery order. The sidecar
/// builds it of [`OutgoingDelivery`] values ([`DeliveryBatch::outgoing`]); a
/// decoded one holds `deliveries`. Were both set, `deliveries` go first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeliveryBatch {
    /// The deliveries, as a client decodes them.
    pub deliveries: Vec<Delivery>,
    outgoing: Vec<OutgoingDelivery>,
}

impl DeliveryBatch {
    /// A batch of deliveries the sidecar built.
    pub fn outgoing(outgoing: Vec<OutgoingDelivery>) -> DeliveryBatch {
        DeliveryBatch { deliveries: Vec::new(), outgoing }
    }
}

impl From<Vec<Delivery>> for DeliveryBatch {
    fn from(deliveries: Vec<Delivery>) -> DeliveryBatch {
        DeliveryBatch { deliveries, outgoing: Vec::new() }
    }
}

impl Message for DeliveryBatch {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encoding::message::encode_repeated(1, &self.deliveries, buf);
        for delivery in &self.outgoing {
            encode_key(1, WireType::LengthDelimited, buf);
            encode_varint(delivery.len as u64, buf);
            delivery.encode_raw(buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag == 1 {
            encoding::message::merge_repeated(wire_type, &mut self.deliveries, buf, ctx).map_err(|mut error| {
                error.push("DeliveryBatch", "deliveries");
                error
            })
        } else {
            encoding::skip_field(wire_type, tag, buf, ctx)
        }
    }

    fn encoded_len(&self) -> usize {
        encoding::message::encoded_len_repeated(1, &self.deliveries)
            + self.outgoing.iter().map(|delivery| nested_len(1, delivery.len)).sum::<usize>()
    }

    fn clear(&mut self) {
        self.deliveries.clear();
        self.outgoing.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Arc<Origin> {
        Arc::new(Origin { stream: "orders".into(), group: "billing".into() })
    }

    fn outgoing(payload: Vec<(&'static [u8], &'static [u8])>, attempts: u32, traceparent: &str) -> OutgoingDelivery {
        let stream_id = StreamId { ms: 1_700_000_000_123, seq: 42 };
        let payload = payload.into_iter().map(|(n, v)| (Bytes::from_static(n), Bytes::from_static(v))).collect();
        let raw = vec![RawField { name: b"\xffraw".to_vec(), value: b"v".to_vec() }];
        OutgoingDelivery::new(
            BrandedId::from_stream_id(StreamId { ms: 1_700_000_000_000, seq: 7 }).unwrap(),
            stream_id,
            origin(),
            payload,
            attempts,
            traceparent.to_owned(),
            raw,
        )
    }

    /// What the generated type encodes, field for field, is what is sent.
    #[test]
    fn it_decodes_as_the_delivery_of_the_same_contents_and_counts_its_length_as_prost_does() {
        let cases = [
            outgoing(vec![(b"n", b"1"), (b"body", b"hello")], 3, "00-aa-bb-01"),
            outgoing(vec![(b"empty", b""), (b"", b"no name")], 0, ""),
            outgoing(vec![], 1, ""),
            outgoing(vec![(b"big", &[7u8; 300])], 200, ""),
        ];
        for case in cases {
            let batch = DeliveryBatch::outgoing(vec![case.clone()]);
            let bytes = batch.encode_to_vec();
            assert_eq!(bytes.len(), batch.encoded_len(), "the length it declares is the length it writes");
            let decoded = DeliveryBatch::decode(&bytes[..]).unwrap();
            let expected = case.clone().into_proto();
            assert_eq!(decoded.deliveries, vec![expected.clone()]);
            assert_eq!(case.encoded_len(), expected.encoded_len(), "prost counts the same length");
            assert_eq!(decoded.deliveries[0].id, "018bcfe568000000000000000007");
            assert_eq!(decoded.deliveries[0].stream_id, "1700000000123-42");
        }
    }

    #[test]
    fn a_new_trace_context_is_counted_in_the_length() {
        let mut delivery = outgoing(vec![(b"k", b"v")], 1, "");
        delivery.set_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned());
        assert_eq!(delivery.encoded_len(), delivery.clone().into_proto().encoded_len());
    }

    #[test]
    fn a_batch_the_client_built_round_trips_and_one_of_both_kinds_puts_decoded_ones_first() {
        let first = outgoing(vec![(b"a", b"1")], 1, "").into_proto();
        let batch = DeliveryBatch::from(vec![first.clone()]);
        assert_eq!(DeliveryBatch::decode(&batch.encode_to_vec()[..]).unwrap(), batch);
        let mut both = DeliveryBatch::outgoing(vec![outgoing(vec![(b"b", b"2")], 2, "")]);
        both.deliveries.push(first.clone());
        let decoded = DeliveryBatch::decode(&both.encode_to_vec()[..]).unwrap();
        assert_eq!(decoded.deliveries.len(), 2);
        assert_eq!(decoded.deliveries[0], first);
        assert_eq!(decoded.deliveries[1].attempts, 2);
    }

    #[test]
    fn owned_payload_leaves_the_reply_and_keeps_the_contents() {
        let reply = Bytes::from(b"name value".to_vec());
        let mut delivery = OutgoingDelivery::new(
            BrandedId::from_stream_id(StreamId { ms: 1, seq: 1 }).unwrap(),
            StreamId { ms: 1, seq: 1 },
            origin(),
            vec![(reply.slice(0..4), reply.slice(5..10))],
            1,
            String::new(),
            Vec::new(),
        );
        delivery.own_payload();
        let in_reply = |bytes: &Bytes| reply.as_ptr_range().contains(&bytes.as_ptr());
        assert!(delivery.payload().iter().all(|(name, value)| !in_reply(name) && !in_reply(value)));
        assert_eq!(delivery.payload(), &[(Bytes::from_static(b"name"), Bytes::from_static(b"value"))]);
    }
}
