package echomq

import (
	"context"
	"fmt"
	"iter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// Streams is the sidecar's StreamService: it appends entries (Append,
// AppendBatch, AppendBatchEntries), reads them (Read, ReadAll) and trims
// streams (Trim), with no consumer group: nothing it does is acknowledged or
// counted as a delivery. The sidecar mints each appended entry's branded id
// on the Redis host, atomically with the XADD.
//
// Streams retries nothing. An append that fails with UNAVAILABLE (Redis
// unreachable, a failover, the sidecar's --wait-replicas not confirmed) or
// DEADLINE_EXCEEDED, or whose call was cut off, may have been written; a
// plain retry could write it twice. Give it a dedup key
// ([AppendOptions.DedupKey], or [BatchEntry.DedupKey]) and retry with the
// same key: if the first attempt was written, the retry writes nothing and
// answers its ids with [AppendResult.Duplicate] set (see the example of
// [Streams.Append]). Reads are safe to retry.
type Streams struct {
	client pb.StreamServiceClient
}

// NewStreams returns a Streams on conn (from [Dial], or your own). It does not
// own conn; one connection can serve it, an [Admin] and any number of
// consumers.
func NewStreams(conn grpc.ClientConnInterface) *Streams {
	return &Streams{client: pb.NewStreamServiceClient(conn)}
}

// Entry is one stream entry, outside any group (as Read and dead letters
// return it).
type Entry struct {
	// ID is the branded id: 28 lowercase hex characters, from the reserved
	// field, else derived from the stream id.
	ID string
	// StreamID is the entry's id in the stream read, `<ms>-<seq>`.
	StreamID string
	// Payload maps field names to values, without the reserved branded-id field.
	Payload map[string][]byte
	// RawFields holds fields whose names are not valid UTF-8 (or repeated
	// names), byte for byte, in stream order. Usually empty.
	RawFields []RawField
	// MintedAt is when the branded id was minted (millisecond precision).
	MintedAt time.Time
	// Traceparent is the W3C trace context stored with the entry, or "".
	Traceparent string
}

func entryFrom(m *pb.Entry) Entry {
	e := Entry{ID: m.GetId(), StreamID: m.GetStreamId(), Payload: m.GetPayload(), Traceparent: m.GetTraceparent()}
	if e.Payload == nil {
		e.Payload = map[string][]byte{}
	}
	if m.GetMintedAt() != nil {
		e.MintedAt = m.GetMintedAt().AsTime()
	}
	for _, f := range m.GetRawFields() {
		e.RawFields = append(e.RawFields, RawField{Name: f.GetName(), Value: f.GetValue()})
	}
	return e
}

// ReadRange is the part of a stream to read. Both bounds are inclusive; each
// is a stream id or an instant (an instant becomes the first, or last, stream
// id of that millisecond), not both: the sidecar refuses both for one bound
// with INVALID_ARGUMENT. The zero ReadRange is the whole stream.
type ReadRange struct {
	// StartID is the first stream id to return (`<ms>-<seq>` or `<ms>`).
	// "" with a zero StartTime: from the oldest entry.
	StartID string
	// StartTime: entries appended at or after this instant.
	StartTime time.Time
	// EndID is the last stream id to return. "" with a zero EndTime: up to
	// the newest entry.
	EndID string
	// EndTime: entries appended at or before this instant.
	EndTime time.Time
	// Count is the page size: the most entries one Read returns (entries).
	// 0: 100. Above 10,000: INVALID_ARGUMENT.
	Count uint32
}

func (r ReadRange) request(stream string) *pb.ReadRequest {
	req := &pb.ReadRequest{Stream: stream, StartId: r.StartID, EndId: r.EndID, Count: r.Count}
	if !r.StartTime.IsZero() {
		req.StartTime = timestamppb.New(r.StartTime)
	}
	if !r.EndTime.IsZero() {
		req.EndTime = timestamppb.New(r.EndTime)
	}
	return req
}

// ReadPage is one page of a stream.
type ReadPage struct {
	// Entries, oldest first.
	Entries []Entry
	// NextStartID is where the next page starts (Read again with it as
	// StartID, a zero StartTime and the same end bound); "" when this page
	// reached the end of the range. A page holds fewer than Count entries
	// when more would not fit in one gRPC message (the sidecar's
	// `--max-message-bytes`).
	NextStartID string
	// OversizedIDs are stream ids in this page's range of entries too large
	// for one gRPC message on their own: left out of Entries (read them with
	// XRANGE).
	OversizedIDs []string
}

// Read returns one page of stream's entries in r, oldest first (XRANGE).
// Follow [ReadPage.NextStartID] for the next page, or use [Streams.ReadAll].
//
// Errors carry the gRPC status ([status.Code] works on them):
// INVALID_ARGUMENT for a bad stream name or id, an id and an instant for one
// bound, Count over 10,000, or the name of a sharded stream (read one shard's
// key); FAILED_PRECONDITION when the key is not a stream; UNAVAILABLE when
// Redis cannot be reached (retry). A stream that does not exist reads as
// empty.
func (s *Streams) Read(ctx context.Context, stream string, r ReadRange) (ReadPage, error) {
	resp, err := s.client.Read(ctx, r.request(stream))
	if err != nil {
		return ReadPage{}, fmt.Errorf("echomq: read %q: %w", stream, err)
	}
	page := ReadPage{
		Entries:      make([]Entry, len(resp.GetEntries())),
		NextStartID:  resp.GetNextStartId(),
		OversizedIDs: resp.GetOversizedIds(),
	}
	for i, e := range resp.GetEntries() {
		page.Entries[i] = entryFrom(e)
	}
	return page, nil
}

// ReadAll iterates over every entry of stream in r, oldest first, reading a
// page of r.Count entries at a time (following NextStartID). An error ends
// the iteration: it is yielded once, with a zero Entry. Entries too large for
// one gRPC message are skipped (as [ReadPage.OversizedIDs] says).
//
//	for e, err := range streams.ReadAll(ctx, "orders", echomq.ReadRange{StartTime: since}) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(e.StreamID, e.Payload)
//	}
func (s *Streams) ReadAll(ctx context.Context, stream string, r ReadRange) iter.Seq2[Entry, error] {
	return func(yield func(Entry, error) bool) {
		for {
			page, err := s.Read(ctx, stream, r)
			if err != nil {
				yield(Entry{}, err)
				return
			}
			for _, e := range page.Entries {
				if !yield(e, nil) {
					return
				}
			}
			if page.NextStartID == "" {
				return
			}
			if page.NextStartID == r.StartID && len(page.Entries) == 0 {
				yield(Entry{}, fmt.Errorf("echomq: read %q: the sidecar's next page starts where this one did (%s)", stream, r.StartID))
				return
			}
			r.StartID, r.StartTime = page.NextStartID, time.Time{}
		}
	}
}

// TrimBound says which entries [Streams.Trim] removes. Exactly one of MaxLen,
// MinID and Before must be set (INVALID_ARGUMENT otherwise).
type TrimBound struct {
	// MaxLen keeps the newest MaxLen entries (entries). 0 means unset: to
	// remove everything, give MinID (the stream's last id plus one) instead.
	MaxLen uint64
	// MinID removes the entries with a stream id below this one.
	MinID string
	// Before removes the entries appended before this instant.
	Before time.Time
	// Approximate lets Redis trim whole radix-tree nodes only (`MINID ~`):
	// cheaper, may keep a few more entries; never removes more than asked.
	Approximate bool
	// IgnoreGroups trims as asked even past entries that groups still have
	// pending or have not read yet — those entries are LOST to the groups.
	// Off by default: the safe mode never removes them.
	IgnoreGroups bool
}

// Trimmed is the old name of [TrimResult].
//
// Deprecated: use [TrimResult], the name every client gives it; Trimmed goes
// away in the next release.
type Trimmed = TrimResult

// TrimResult is what [Streams.Trim] did.
type TrimResult struct {
	// Count is the number of entries removed (XTRIM's reply).
	Count uint64
	// AppliedMinID is the MINID bound applied: entries below it are gone. ""
	// when nothing could be trimmed.
	AppliedMinID string
	// HeldBackByGroups is true when the safe mode raised the bound to keep a
	// group's pending or unread entries.
	HeldBackByGroups bool
}

// Trim removes the oldest entries of stream (XTRIM MINID) down to b. In the
// safe mode (the default) it never removes an entry that a group of the
// stream still has pending or has not read yet: the bound is raised to the
// oldest such entry (TrimResult.HeldBackByGroups), computed and applied
// atomically on the Redis host. With an archive configured on the sidecar,
// what is trimmed is archived first.
//
// Errors carry the gRPC status: INVALID_ARGUMENT without exactly one bound
// (or for the name of a sharded stream: trim one shard's key);
// FAILED_PRECONDITION when the key is not a stream; UNAVAILABLE when Redis
// cannot be reached (retry).
func (s *Streams) Trim(ctx context.Context, stream string, b TrimBound) (TrimResult, error) {
	req := &pb.TrimRequest{Stream: stream, MaxLen: b.MaxLen, MinId: b.MinID, Approximate: b.Approximate, IgnoreGroups: b.IgnoreGroups}
	if !b.Before.IsZero() {
		req.Before = timestamppb.New(b.Before)
	}
	resp, err := s.client.Trim(ctx, req)
	if err != nil {
		return TrimResult{}, fmt.Errorf("echomq: trim %q: %w", stream, err)
	}
	return TrimResult{Count: resp.GetTrimmed(), AppliedMinID: resp.GetAppliedMinId(), HeldBackByGroups: resp.GetHeldBackByGroups()}, nil
}
