package echomq

import (
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// consumeCodec is the Consume call's codec: grpc's proto codec, except that a
// ConsumeResponse carrying deliveries is decoded by decodeDeliveries, by hand.
//
// Why: protobuf-go's generic decoder walks the Delivery message by reflection
// and allocates every field separately (the payload map's keys and values, each
// string, the Timestamp), which made the unmarshal the largest single cost of
// the client per delivery, with its garbage the next (see BenchmarkConsume).
// The hand decoder fills the same *pb.ConsumeResponse (interceptors and stats
// handlers see what they always saw) with a handful of allocations per
// delivery: the deliveries and timestamps of a frame in one slab, one
// string block holding a delivery's id, stream id and traceparent, one byte
// block holding its payload values, and its map; stream, group and field names
// are interned (they repeat on every delivery). Each delivery owns its blocks,
// so a handler that keeps one delivery's values keeps nothing of the others.
//
// It decodes only what it fully understands: a message with a field it does
// not know, a wire type it does not expect, a repeated singular field or a
// string that is not UTF-8 goes to proto.Unmarshal whole, so the result is
// always what proto.Unmarshal would give (codec_test.go checks both, and
// fails when the proto gains a field this decoder has not learnt).
//
// One codec per call: grpc calls Unmarshal from the call's one receiving
// goroutine, which is what lets the intern table go without a lock.
type consumeCodec struct {
	proto  encoding.CodecV2
	intern interner
	// spans is scratch for one delivery's payload entries, reused.
	spans []entrySpan
	// last holds the stream, the group and the field names of the last
	// delivery decoded, by place (see recall).
	last lastNames
	// parts is scratch for the bytes of one frame's deliveries, reused:
	// grown anew for every frame, it cost as many bytes per delivery as the
	// delivery's own strings.
	parts [][]byte
	// slots and out are the slab of the last frame decoded: its Deliveries
	// (with their minted_at) and the pointers to them. They are reused for
	// the next frame once the consumer has copied the deliveries out and
	// said so (recycle), which recycled records.
	slots    []deliverySlot
	out      []*pb.Delivery
	recycled bool
}

func newConsumeCodec() *consumeCodec {
	return &consumeCodec{proto: encoding.GetCodecV2(grpcproto.Name)}
}

// Name is grpc's proto codec's: the call's content-type stays the proto one.
func (c *consumeCodec) Name() string { return grpcproto.Name }

func (c *consumeCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c *consumeCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*pb.ConsumeResponse)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	// Everything decoded is copied out of b, which goes back to grpc's pool.
	if c.decodeResponse(b, m) {
		return nil
	}
	proto.Reset(m)
	return proto.Unmarshal(b, m)
}

// Field numbers the decoder knows (consumer_service.proto, types.proto and
// google/protobuf/timestamp.proto).
const (
	fieldResponseDelivery = 2
	fieldResponseBatch    = 4
	fieldBatchDeliveries  = 1

	fieldDeliveryID          = 1
	fieldDeliveryStreamID    = 2
	fieldDeliveryStream      = 3
	fieldDeliveryGroup       = 4
	fieldDeliveryPayload     = 5
	fieldDeliveryAttempts    = 6
	fieldDeliveryMintedAt    = 7
	fieldDeliveryTraceparent = 8
	fieldDeliveryRawFields   = 9

	fieldEntryKey   = 1
	fieldEntryValue = 2

	fieldRawName  = 1
	fieldRawValue = 2

	fieldTimestampSeconds = 1
	fieldTimestampNanos   = 2
)

// decodeResponse decodes a ConsumeResponse that is one Delivery or one
// DeliveryBatch into m; false (m possibly half-filled) for anything else.
func (c *consumeCodec) decodeResponse(b []byte, m *pb.ConsumeResponse) bool {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || typ != protowire.BytesType {
		return false
	}
	body, l := protowire.ConsumeBytes(b[n:])
	if l < 0 || n+l != len(b) {
		return false // not one field: let proto.Unmarshal merge or refuse
	}
	switch num {
	case fieldResponseDelivery:
		ds, ok := c.decodeDeliveries([][]byte{body})
		if !ok {
			return false
		}
		m.Kind = &pb.ConsumeResponse_Delivery{Delivery: ds[0]}
		return true
	case fieldResponseBatch:
		parts, ok := c.splitBatch(body)
		if !ok {
			return false
		}
		ds, ok := c.decodeDeliveries(parts)
		clear(parts) // they point into grpc's buffer, which goes back to its pool
		if !ok {
			return false
		}
		m.Kind = &pb.ConsumeResponse_Batch{Batch: &pb.DeliveryBatch{Deliveries: ds}}
		return true
	default:
		return false
	}
}

// splitBatch returns the bytes of each Delivery of a DeliveryBatch's body, in
// c.parts.
func (c *consumeCodec) splitBatch(body []byte) ([][]byte, bool) {
	parts := c.parts[:0]
	for len(body) > 0 {
		num, typ, n := protowire.ConsumeTag(body)
		if n < 0 || num != fieldBatchDeliveries || typ != protowire.BytesType {
			return nil, false
		}
		part, l := protowire.ConsumeBytes(body[n:])
		if l < 0 {
			return nil, false
		}
		parts = append(parts, part)
		body = body[n+l:]
	}
	c.parts = parts
	return parts, true
}

// decodeDeliveries decodes each part, a Delivery's bytes.
func (c *consumeCodec) decodeDeliveries(parts [][]byte) ([]*pb.Delivery, bool) {
	slots, out := c.slab(len(parts))
	for i, part := range parts {
		s := &slots[i]
		out[i] = &s.msg
		var stamp stampValue
		if !c.decodeDelivery(part, &s.msg, &stamp) {
			c.recycled = true // nothing refers to the slab: proto.Unmarshal decodes the message
			return nil, false
		}
		if stamp.set {
			s.stamp.Seconds, s.stamp.Nanos = stamp.seconds, stamp.nanos
			s.msg.MintedAt = &s.stamp
		}
	}
	return out, true
}

// slab returns n zeroed slots and the pointers' slice for a frame: the last
// frame's, cleared, if the consumer recycled them and they have room, else
// new ones.
//
// Why: the consumer copies every delivery into its own [Delivery] at once
// (Delivery.fill), so a frame's pb.Deliveries are garbage as soon as they
// are decoded: 215 bytes a delivery, a third of what the decoder allocated
// besides the deliveries' own payload and strings, in a 55 KB slab per full
// frame (a large object: zeroed, and taken from the heap under its lock).
// Fewer bytes allocated is fewer GC cycles, and with a small heap each
// cycle costs the consumer more than the decoding of its frames.
func (c *consumeCodec) slab(n int) ([]deliverySlot, []*pb.Delivery) {
	if c.recycled && cap(c.slots) >= n {
		c.recycled = false
		slots := c.slots[:n]
		clear(slots)
		return slots, c.out[:n]
	}
	c.recycled = false
	c.slots = make([]deliverySlot, n)
	c.out = make([]*pb.Delivery, n)
	return c.slots, c.out
}

// recycle tells the codec that the consumer is done with ds, the deliveries
// of the frame it decoded last (it copied them into its Deliveries), so the
// next frame may reuse their slab. Nothing else keeps a received
// ConsumeResponse: the consumer drops it, and a stream interceptor that
// would keep one past the next Recv finds its deliveries reused. Called
// from the receiving goroutine, like Unmarshal; a nil codec (unit tests'
// calls) does nothing.
func (c *consumeCodec) recycle(ds []*pb.Delivery) {
	if c != nil && len(ds) > 0 && len(c.slots) > 0 && ds[0] == &c.slots[0].msg {
		c.recycled = true
	}
}

// deliverySlot is a decoded Delivery with room for its minted_at, which the
// sidecar always sets. A frame's slots are one allocation: a slab of
// Deliveries and one of Timestamps cost an allocation more and, in a full
// frame of 256, 24 bytes more per delivery (the Delivery slab is rounded up
// to whole pages; 256 slots fill theirs).
type deliverySlot struct {
	msg   pb.Delivery
	stamp timestamppb.Timestamp
}

// span is a field's bytes within a delivery: b[start:end].
type span struct{ start, end int }

func (s span) len() int { return s.end - s.start }

// entrySpan is one payload map entry.
type entrySpan struct{ key, value span }

// stampValue is a decoded Timestamp, before it moves into its frame's slab.
type stampValue struct {
	seconds int64
	nanos   int32
	set     bool
}

// decodeDelivery decodes one Delivery into d, but for its minted_at, which
// goes to *stamp.
func (c *consumeCodec) decodeDelivery(b []byte, d *pb.Delivery, stamp *stampValue) bool {
	var id, streamID, stream, group, traceparent span
	var seen uint32 // bit per singular field number
	c.spans = c.spans[:0]
	values := 0
	for pos := 0; pos < len(b); {
		num, typ, n := protowire.ConsumeTag(b[pos:])
		if n < 0 {
			return false
		}
		pos += n
		if num != fieldDeliveryPayload && num != fieldDeliveryRawFields {
			if num >= 32 || seen&(1<<num) != 0 {
				return false
			}
			seen |= 1 << num
		}
		if num == fieldDeliveryAttempts {
			if typ != protowire.VarintType {
				return false
			}
			v, n := protowire.ConsumeVarint(b[pos:])
			if n < 0 {
				return false
			}
			pos += n
			d.Attempts = uint32(v)
			continue
		}
		if typ != protowire.BytesType {
			return false
		}
		v, n := protowire.ConsumeBytes(b[pos:])
		if n < 0 {
			return false
		}
		at := span{pos + n - len(v), pos + n}
		pos += n
		switch num {
		case fieldDeliveryID:
			id = at
		case fieldDeliveryStreamID:
			streamID = at
		case fieldDeliveryStream:
			stream = at
		case fieldDeliveryGroup:
			group = at
		case fieldDeliveryTraceparent:
			traceparent = at
		case fieldDeliveryPayload:
			e, ok := decodeEntry(b, at)
			if !ok {
				return false
			}
			c.spans = append(c.spans, e)
			values += e.value.len()
		case fieldDeliveryMintedAt:
			if !decodeTimestamp(v, stamp) {
				return false
			}
		case fieldDeliveryRawFields:
			f, ok := decodeRawField(v)
			if !ok {
				return false
			}
			d.RawFields = append(d.RawFields, f)
		default:
			return false
		}
	}

	// One string for the delivery's own strings, sliced. (A Builder's String
	// is its buffer, so the bytes are copied once.)
	var sb strings.Builder
	sb.Grow(id.len() + streamID.len() + traceparent.len())
	for _, s := range [...]span{id, streamID, traceparent} {
		sb.Write(b[s.start:s.end])
	}
	text := sb.String()
	if !utf8.ValidString(text) {
		return false
	}
	d.Id, text = text[:id.len()], text[id.len():]
	d.StreamId, d.Traceparent = text[:streamID.len()], text[streamID.len():]
	var ok bool
	if d.Stream, ok = c.recall(&c.last.stream, b[stream.start:stream.end]); !ok {
		return false
	}
	if d.Group, ok = c.recall(&c.last.group, b[group.start:group.end]); !ok {
		return false
	}

	if len(c.spans) > 0 {
		block := make([]byte, 0, values)
		d.Payload = make(map[string][]byte, len(c.spans))
		for i, e := range c.spans {
			key, ok := c.recallKey(i, b[e.key.start:e.key.end])
			if !ok {
				return false
			}
			start := len(block)
			block = append(block, b[e.value.start:e.value.end]...)
			// Capped, so that appending to one value cannot overwrite the next.
			d.Payload[key] = block[start:len(block):len(block)]
		}
	}
	return true
}

// lastNames is what recall compares with.
type lastNames struct {
	stream, group string
	// keys[i] is the name of the last delivery's i-th payload field, for
	// the first maxLastKeys fields.
	keys []string
}

// maxLastKeys bounds lastNames.keys: an entry with more fields than that
// interns the others.
const maxLastKeys = 16

// recall returns b as a string: *last if b spells it, else the interned b,
// which becomes *last. A frame's deliveries repeat their stream, group and
// field names in the same places, and comparing with the last one costs less
// than hashing b into the intern table (four lookups per delivery).
func (c *consumeCodec) recall(last *string, b []byte) (string, bool) {
	if string(b) == *last { // no allocation: a comparison
		return *last, true
	}
	s, ok := c.intern.get(b)
	if ok {
		*last = s
	}
	return s, ok
}

// recallKey is recall for the name of a delivery's i-th payload field.
func (c *consumeCodec) recallKey(i int, b []byte) (string, bool) {
	if i >= maxLastKeys {
		return c.intern.get(b)
	}
	if i >= len(c.last.keys) {
		c.last.keys = append(c.last.keys, make([]string, i+1-len(c.last.keys))...)
	}
	return c.recall(&c.last.keys[i], b)
}

// decodeEntry decodes the payload map entry at b[at]; as proto.Unmarshal
// does, a later key or value in the entry wins and a missing one is empty.
func decodeEntry(b []byte, at span) (entrySpan, bool) {
	var e entrySpan
	e.key = span{at.start, at.start}
	e.value = e.key
	for pos := at.start; pos < at.end; {
		num, typ, n := protowire.ConsumeTag(b[pos:at.end])
		if n < 0 || typ != protowire.BytesType || (num != fieldEntryKey && num != fieldEntryValue) {
			return e, false
		}
		pos += n
		v, n := protowire.ConsumeBytes(b[pos:at.end])
		if n < 0 {
			return e, false
		}
		s := span{pos + n - len(v), pos + n}
		pos += n
		if num == fieldEntryKey {
			e.key = s
		} else {
			e.value = s
		}
	}
	return e, true
}

func decodeTimestamp(b []byte, ts *stampValue) bool {
	ts.set = true
	var seen uint32
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.VarintType || (num != fieldTimestampSeconds && num != fieldTimestampNanos) || seen&(1<<num) != 0 {
			return false
		}
		seen |= 1 << num
		v, l := protowire.ConsumeVarint(b[n:])
		if l < 0 {
			return false
		}
		if num == fieldTimestampSeconds {
			ts.seconds = int64(v)
		} else {
			ts.nanos = int32(v)
		}
		b = b[n+l:]
	}
	return true
}

// decodeRawField decodes a RawField (rare: a field name that is not UTF-8).
func decodeRawField(b []byte) (*pb.RawField, bool) {
	f := &pb.RawField{}
	var seen uint32
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || (num != fieldRawName && num != fieldRawValue) || seen&(1<<num) != 0 {
			return nil, false
		}
		seen |= 1 << num
		v, l := protowire.ConsumeBytes(b[n:])
		if l < 0 {
			return nil, false
		}
		if num == fieldRawName {
			f.Name = append([]byte{}, v...)
		} else {
			f.Value = append([]byte{}, v...)
		}
		b = b[n+l:]
	}
	return f, true
}

// internLimit bounds the intern table: stream, group and field names repeat,
// but a stream whose field names never do must not grow it for ever.
const internLimit = 512

// interner returns one string per distinct short text it has seen (stream,
// group, field names), so that a frame of deliveries does not allocate the
// same names once per delivery.
type interner struct {
	m map[string]string
}

// get returns b as a string, or false if b is not UTF-8 (a proto string must
// be).
func (in *interner) get(b []byte) (string, bool) {
	if len(b) == 0 {
		return "", true
	}
	if s, ok := in.m[string(b)]; ok { // no allocation: the compiler looks up b itself
		return s, true
	}
	if !utf8.Valid(b) {
		return "", false
	}
	s := string(b)
	if len(b) <= 256 && len(in.m) < internLimit {
		if in.m == nil {
			in.m = make(map[string]string)
		}
		in.m[s] = s
	}
	return s, true
}
