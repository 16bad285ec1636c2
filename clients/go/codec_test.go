package echomq

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// The hand decoder of consumeCodec must give exactly what proto.Unmarshal
// gives, for every message: these tests decode the same bytes both ways.

// decodeBoth decodes b with the consume codec and with proto.Unmarshal and
// fails unless both agree (both refuse, or both give equal messages). fast
// reports whether the hand decoder took it (rather than falling back).
func decodeBoth(t *testing.T, b []byte) (got *pb.ConsumeResponse, fast bool) {
	t.Helper()
	want := &pb.ConsumeResponse{}
	wantErr := proto.Unmarshal(b, want)
	c := newConsumeCodec()
	probe := &pb.ConsumeResponse{}
	fast = c.decodeResponse(b, probe)
	got = &pb.ConsumeResponse{}
	// Split the bytes in two buffers, as grpc may hand them over.
	half := len(b) / 2
	err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(slices.Clone(b[:half])), mem.SliceBuffer(slices.Clone(b[half:]))}, got)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("codec error %v, proto.Unmarshal error %v", err, wantErr)
	}
	if err == nil && !proto.Equal(got, want) {
		t.Fatalf("codec decoded\n%v\nproto.Unmarshal decoded\n%v", got, want)
	}
	if fast && !proto.Equal(probe, want) {
		t.Fatalf("hand decoder decoded\n%v\nproto.Unmarshal decoded\n%v", probe, want)
	}
	return got, fast
}

func randomDelivery(r *rand.Rand) *pb.Delivery {
	d := &pb.Delivery{
		Id:       fmt.Sprintf("%028x", r.Uint64()),
		StreamId: fmt.Sprintf("%d-%d", r.Uint64()>>20, r.IntN(100)),
		Stream:   []string{"orders", "orders:{orders:1}", "ünïcode"}[r.IntN(3)],
		Group:    "g",
		Attempts: uint32(r.IntN(5)),
	}
	if r.IntN(2) == 0 {
		d.MintedAt = &timestamppb.Timestamp{Seconds: r.Int64N(1 << 40), Nanos: int32(r.IntN(1e9))}
	}
	if r.IntN(3) == 0 {
		d.Traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	}
	for range r.IntN(6) {
		if d.Payload == nil {
			d.Payload = map[string][]byte{}
		}
		value := make([]byte, r.IntN(200))
		for i := range value {
			value[i] = byte(r.Uint32())
		}
		d.Payload[fmt.Sprintf("f%d", r.IntN(8))] = value
	}
	if r.IntN(10) == 0 {
		d.RawFields = append(d.RawFields, &pb.RawField{Name: []byte{0xff, 'x'}, Value: []byte("v")})
	}
	return d
}

func TestCodecDecodesDeliveriesAsProtoUnmarshalDoes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		var m *pb.ConsumeResponse
		if i%5 == 0 {
			m = &pb.ConsumeResponse{Kind: &pb.ConsumeResponse_Delivery{Delivery: randomDelivery(r)}}
		} else {
			batch := &pb.DeliveryBatch{}
			for range 1 + r.IntN(40) {
				batch.Deliveries = append(batch.Deliveries, randomDelivery(r))
			}
			m = &pb.ConsumeResponse{Kind: &pb.ConsumeResponse_Batch{Batch: batch}}
		}
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, fast := decodeBoth(t, b); !fast {
			t.Fatalf("message %d was not decoded by the hand decoder", i)
		}
	}
}

func TestCodecLeavesOtherMessagesToProto(t *testing.T) {
	for _, m := range []*pb.ConsumeResponse{
		{Kind: &pb.ConsumeResponse_Subscribed{Subscribed: &pb.Subscribed{Stream: "s", Group: "g", Consumer: "c", MaxInFlight: 3}}},
		{Kind: &pb.ConsumeResponse_VerdictError{VerdictError: &pb.VerdictError{Id: "x", Code: pb.VerdictErrorCode_VERDICT_ERROR_CODE_LEASE_LOST, Message: "m"}}},
		{},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if got, fast := decodeBoth(t, b); fast || !proto.Equal(got, m) {
			t.Fatalf("%v: decoded %v (by hand: %v)", m, got, fast)
		}
	}
}

// TestCodecFallsBackOnWhatItDoesNotKnow feeds edited deliveries: an unknown
// field, a repeated singular field, strings that are not UTF-8, a bad wire type,
// truncations. Each must decode (or be refused) exactly as by proto.Unmarshal.
func TestCodecFallsBackOnWhatItDoesNotKnow(t *testing.T) {
	d := &pb.Delivery{Id: "0123456789abcdef0123456789ab", StreamId: "1-1", Stream: "s", Group: "g",
		Payload: map[string][]byte{"k": []byte("v")}, Attempts: 1, MintedAt: &timestamppb.Timestamp{Seconds: 5}}
	base, err := proto.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	wrap := func(delivery []byte) []byte {
		batch := protowire.AppendTag(nil, fieldBatchDeliveries, protowire.BytesType)
		batch = protowire.AppendBytes(batch, delivery)
		out := protowire.AppendTag(nil, fieldResponseBatch, protowire.BytesType)
		return protowire.AppendBytes(out, batch)
	}
	field := func(num protowire.Number, typ protowire.Type, v []byte) []byte {
		b := protowire.AppendTag(nil, num, typ)
		if typ == protowire.BytesType {
			return protowire.AppendBytes(b, v)
		}
		return append(b, v...)
	}
	entry := func(k, v []byte) []byte {
		return append(field(fieldEntryKey, protowire.BytesType, k), field(fieldEntryValue, protowire.BytesType, v)...)
	}
	cases := map[string][]byte{
		"unknown field":            append(slices.Clone(base), field(99, protowire.BytesType, []byte("new"))...),
		"unknown varint field":     append(slices.Clone(base), field(10, protowire.VarintType, []byte{1})...),
		"repeated id":              append(slices.Clone(base), field(fieldDeliveryID, protowire.BytesType, []byte("later"))...),
		"repeated minted_at":       append(slices.Clone(base), field(fieldDeliveryMintedAt, protowire.BytesType, []byte{0x10, 7})...),
		"id not UTF-8":             append(slices.Clone(base[:0]), field(fieldDeliveryID, protowire.BytesType, []byte{0xff})...),
		"stream not UTF-8":         field(fieldDeliveryStream, protowire.BytesType, []byte{0xc3}),
		"key not UTF-8":            field(fieldDeliveryPayload, protowire.BytesType, entry([]byte{0xff}, []byte("v"))),
		"entry without value":      field(fieldDeliveryPayload, protowire.BytesType, field(fieldEntryKey, protowire.BytesType, []byte("k"))),
		"entry without key":        field(fieldDeliveryPayload, protowire.BytesType, field(fieldEntryValue, protowire.BytesType, []byte("v"))),
		"entry with a later value": field(fieldDeliveryPayload, protowire.BytesType, append(entry([]byte("k"), []byte("a")), field(fieldEntryValue, protowire.BytesType, []byte("b"))...)),
		"duplicate keys":           append(field(fieldDeliveryPayload, protowire.BytesType, entry([]byte("k"), []byte("a"))), field(fieldDeliveryPayload, protowire.BytesType, entry([]byte("k"), []byte("b")))...),
		"attempts as bytes":        field(fieldDeliveryAttempts, protowire.BytesType, []byte("1")),
		"id as varint":             field(fieldDeliveryID, protowire.VarintType, []byte{1}),
		"empty minted_at":          field(fieldDeliveryMintedAt, protowire.BytesType, nil),
		"negative nanos":           field(fieldDeliveryMintedAt, protowire.BytesType, protowire.AppendVarint([]byte{0x10}, uint64(0xffffffffffffffff))),
		"empty delivery":           nil,
	}
	for i := range base {
		cases[fmt.Sprintf("cut at %d", i)] = base[:i]
	}
	for name, delivery := range cases {
		t.Run(name, func(t *testing.T) {
			decodeBoth(t, wrap(delivery))
			single := protowire.AppendTag(nil, fieldResponseDelivery, protowire.BytesType)
			decodeBoth(t, protowire.AppendBytes(single, delivery))
			full := wrap(delivery)
			for i := range full {
				decodeBoth(t, full[:i])
			}
		})
	}
	// Two kinds in one response (the later wins, or merges): proto's business.
	two := append(wrap(base), wrap(base)...)
	if _, fast := decodeBoth(t, two); fast {
		t.Fatal("two batches in one response were decoded by hand")
	}
}

// TestCodecValuesAreOwnedByTheirDelivery: a value kept by a handler is not
// overwritten by a later frame nor by appending to another value.
func TestCodecValuesAreOwnedByTheirDelivery(t *testing.T) {
	c := newConsumeCodec()
	frame := func(v string) []byte {
		m := &pb.ConsumeResponse{Kind: &pb.ConsumeResponse_Batch{Batch: &pb.DeliveryBatch{Deliveries: []*pb.Delivery{
			{Id: "a", Payload: map[string][]byte{"x": []byte(v), "y": []byte(v)}},
		}}}}
		b, _ := proto.Marshal(m)
		return b
	}
	buf := frame("first")
	var m1 pb.ConsumeResponse
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(buf)}, &m1); err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = 0 // grpc reuses its buffers
	}
	var m2 pb.ConsumeResponse
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(frame("other"))}, &m2); err != nil {
		t.Fatal(err)
	}
	p := m1.GetBatch().GetDeliveries()[0].GetPayload()
	_ = append(p["x"], "!!!!!"...)
	if !bytes.Equal(p["x"], []byte("first")) || !bytes.Equal(p["y"], []byte("first")) {
		t.Fatalf("payload changed under the handler: %q", p)
	}
}

// TestCodecRecycledSlabDecodesAsProtoUnmarshalDoes: once the consumer has
// recycled a frame, the next one reuses its slab, and nothing of the earlier
// deliveries (payload, raw fields, traceparent, minted_at, attempts) shows in
// the later ones; a frame not recycled is never reused.
func TestCodecRecycledSlabDecodesAsProtoUnmarshalDoes(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	c := newConsumeCodec()
	var last []*pb.Delivery
	reused := 0
	for i := range 200 {
		batch := &pb.DeliveryBatch{}
		for range 1 + r.IntN(40) {
			batch.Deliveries = append(batch.Deliveries, randomDelivery(r))
		}
		m := &pb.ConsumeResponse{Kind: &pb.ConsumeResponse_Batch{Batch: batch}}
		if i%7 == 0 {
			m = &pb.ConsumeResponse{Kind: &pb.ConsumeResponse_Delivery{Delivery: randomDelivery(r)}}
		}
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var kept []*pb.Delivery
		if i%5 == 4 {
			kept = last // not recycled: must stay as decoded
		} else {
			c.recycle(last)
		}
		var keptWant []*pb.Delivery
		for _, d := range kept {
			keptWant = append(keptWant, proto.Clone(d).(*pb.Delivery))
		}
		before := c.slots
		var got pb.ConsumeResponse
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got); err != nil {
			t.Fatal(err)
		}
		if len(before) > 0 && &c.slots[:1][0] == &before[:1][0] {
			if kept != nil {
				t.Fatalf("frame %d reused the slab of a frame not recycled", i)
			}
			reused++
		}
		if !proto.Equal(&got, m) {
			t.Fatalf("frame %d decoded\n%v\nwant\n%v", i, &got, m)
		}
		for j, d := range kept {
			if !proto.Equal(d, keptWant[j]) {
				t.Fatalf("frame %d: a delivery of the frame before, not recycled, changed: %v, was %v", i, d, keptWant[j])
			}
		}
		if d := got.GetDelivery(); d != nil {
			last = []*pb.Delivery{d}
		} else {
			last = got.GetBatch().GetDeliveries()
		}
	}
	if reused == 0 {
		t.Fatal("no frame reused a recycled slab")
	}
}

// TestCodecKnowsEveryField fails when the proto gains a field the hand decoder
// does not decode: it would still be correct (such a message falls back to
// proto.Unmarshal), but every delivery would take the slow path. Teach
// decodeDelivery the field, then add it here.
func TestCodecKnowsEveryField(t *testing.T) {
	known := map[protoreflect.FullName][]protoreflect.FieldNumber{
		// Subscribed (1), VerdictError (3) and Emitted (5) are rare and go
		// to proto.Unmarshal on purpose; only deliveries take the fast path.
		"echomq.v1.ConsumeResponse":       {1, fieldResponseDelivery, 3, fieldResponseBatch, 5},
		"echomq.v1.DeliveryBatch":         {fieldBatchDeliveries},
		"echomq.v1.Delivery":              {fieldDeliveryID, fieldDeliveryStreamID, fieldDeliveryStream, fieldDeliveryGroup, fieldDeliveryPayload, fieldDeliveryAttempts, fieldDeliveryMintedAt, fieldDeliveryTraceparent, fieldDeliveryRawFields},
		"echomq.v1.RawField":              {fieldRawName, fieldRawValue},
		"google.protobuf.Timestamp":       {fieldTimestampSeconds, fieldTimestampNanos},
		"echomq.v1.Delivery.PayloadEntry": {fieldEntryKey, fieldEntryValue},
	}
	for _, md := range []protoreflect.MessageDescriptor{
		(&pb.ConsumeResponse{}).ProtoReflect().Descriptor(),
		(&pb.DeliveryBatch{}).ProtoReflect().Descriptor(),
		(&pb.Delivery{}).ProtoReflect().Descriptor(),
		(&pb.Delivery{}).ProtoReflect().Descriptor().Fields().ByName("payload").Message(),
		(&pb.RawField{}).ProtoReflect().Descriptor(),
		(&timestamppb.Timestamp{}).ProtoReflect().Descriptor(),
	} {
		var nums []protoreflect.FieldNumber
		for i := range md.Fields().Len() {
			nums = append(nums, md.Fields().Get(i).Number())
		}
		slices.Sort(nums)
		want := slices.Sorted(slices.Values(known[md.FullName()]))
		if !slices.Equal(nums, want) {
			t.Errorf("%s has fields %v; the hand decoder knows %v: teach it (codec.go)", md.FullName(), nums, want)
		}
	}
}

// benchFrame is a frame like scripts/bench-peers' (256 deliveries with fields
// `n` and a 100-byte `body`).
func benchFrame(b *testing.B) []byte {
	batch := &pb.DeliveryBatch{}
	for i := range 256 {
		batch.Deliveries = append(batch.Deliveries, &pb.Delivery{
			Id: fmt.Sprintf("%028x", i), StreamId: fmt.Sprintf("1718000000000-%d", i), Stream: "bench", Group: "g",
			Payload:  map[string][]byte{"n": []byte(fmt.Sprint(i)), "body": bytes.Repeat([]byte("x"), 100)},
			Attempts: 1, MintedAt: &timestamppb.Timestamp{Seconds: 1718000000, Nanos: 1e6},
		})
	}
	out, err := proto.Marshal(&pb.ConsumeResponse{Kind: &pb.ConsumeResponse_Batch{Batch: batch}})
	if err != nil {
		b.Fatal(err)
	}
	return out
}

func BenchmarkDecodeFrame(b *testing.B) {
	frame := benchFrame(b)
	b.Run("proto.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			var m pb.ConsumeResponse
			if err := proto.Unmarshal(frame, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("consumeCodec", func(b *testing.B) {
		b.ReportAllocs()
		c := newConsumeCodec()
		for range b.N {
			var m pb.ConsumeResponse
			if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(frame)}, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
