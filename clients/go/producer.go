package echomq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// Producer is the old name of [Streams], which appends as well as reads and
// trims.
//
// Deprecated: use [Streams] (the same type: Append, AppendBatch,
// AppendBatchEntries, Read, ReadAll, Trim). Producer goes away in the next
// release.
type Producer = Streams

// NewProducer returns a [Streams] on conn.
//
// Deprecated: use [NewStreams]; NewProducer goes away in the next release.
func NewProducer(conn grpc.ClientConnInterface) *Producer {
	return NewStreams(conn)
}

// Appended is the old name of [AppendResult].
//
// Deprecated: use [AppendResult], the name every client gives it; Appended
// goes away in the next release.
type Appended = AppendResult

// AppendResult is what an append wrote.
type AppendResult struct {
	// ID is the branded id, 28 lowercase hex characters.
	ID string
	// StreamID is the entry's stream id, `<ms>-<seq>`; "" for a scheduled
	// entry (its stream id is only known when it enters the stream).
	StreamID string
	// Stream is the stream key written: the stream appended to, or for a
	// sharded stream (the sidecar's --sharded-streams) the shard's key,
	// `<stream>:{<stream>:<k>}`.
	Stream string
	// Duplicate is true when the append's dedup key was already recorded on
	// the stream (within the sidecar's --dedup-window-ms): nothing was
	// written, and ID, StreamID and Stream are the first append's. Always
	// false without a dedup key.
	Duplicate bool
	// Scheduled is true when the entry was scheduled ([AppendOptions.DeliverAt]
	// or Delay in the future): ID is final, StreamID is "", and the entry
	// enters the stream when due ([Streams.CancelScheduled] can still remove
	// it). A duplicate of a scheduled append says so too.
	Scheduled bool
}

// BatchEntry is one entry of [Streams.AppendBatchEntries]: its fields and,
// optionally, its dedup key (as [AppendOptions.DedupKey]; "" for none) and
// its schedule (as [AppendOptions.DeliverAt] and Delay; zero for none). A
// batch may mix entries with and without keys, appended at once and
// scheduled.
type BatchEntry struct {
	Fields   map[string][]byte
	DedupKey string
	// DeliverAt schedules the entry for this instant; the zero Time: at once.
	DeliverAt time.Time
	// Delay schedules the entry this long after the append; 0: at once.
	Delay time.Duration
}

// request is e as the proto's BatchEntry.
func (e BatchEntry) request() *pb.BatchEntry {
	m := &pb.BatchEntry{Fields: e.Fields, DedupKey: e.DedupKey}
	if !e.DeliverAt.IsZero() {
		m.DeliverAt = timestamppb.New(e.DeliverAt)
	}
	if e.Delay != 0 {
		m.Delay = durationpb.New(e.Delay)
	}
	return m
}

// AppendOptions tunes an append, as a struct like every other setting of this
// package ([ConsumerConfig], [ReadRange], [TrimBound], [ReplayOptions]). Pass
// it after the fields; the zero value (or none) appends with no trimming, no
// partition key and no dedup key:
//
//	streams.Append(ctx, "orders", fields, echomq.AppendOptions{DedupKey: "order-1001"})
type AppendOptions struct {
	// MaxLen > 0 trims the stream to about MaxLen entries as part of the XADD
	// (`MAXLEN ~ n`: Redis trims whole nodes, so a few more may stay). 0:
	// nothing is trimmed.
	MaxLen uint64
	// PartitionKey picks the shard of a sharded stream (the sidecar's
	// --sharded-streams): entries with the same key go to the same shard, so
	// they are consumed in the order they were appended. "": the shards are
	// taken in turn. A stream that is not sharded ignores it. A batch goes to
	// one shard as a whole.
	PartitionKey string
	// DedupKey makes an append idempotent: if an append to the same stream
	// with the same key was recorded within the sidecar's --dedup-window-ms
	// (2 minutes by default), nothing is written and the answer is that
	// append's, with [AppendResult.Duplicate] set. So an append whose outcome is
	// unknown (UNAVAILABLE, DEADLINE_EXCEEDED, a lost connection) can be
	// retried with the same key without a second copy. "": no deduplication.
	// A key over the sidecar's --max-name-bytes (1024) is INVALID_ARGUMENT.
	// On a sharded stream, retry with the same PartitionKey (or none).
	//
	// It applies to [Streams.Append] only: a batch's entries carry their own
	// keys ([BatchEntry.DedupKey]), and [Streams.AppendBatch] and
	// [Streams.AppendBatchEntries] refuse it.
	DedupKey string
	// DeliverAt schedules the entry: it gets its branded id now
	// ([AppendResult.Scheduled] is set) and enters the stream at this
	// instant (within the sidecar's --schedule-poll-ms), exactly once; until
	// then no consumer or [Streams.Read] sees it, [Streams.ListScheduled]
	// does and [Streams.CancelScheduled] removes it. An instant already past
	// appends at once. The zero Time: at once. More than 365 days ahead, or
	// with MaxLen or Delay, is the sidecar's INVALID_ARGUMENT.
	//
	// Delay schedules the entry this long after the append (on the Redis
	// server's clock), as DeliverAt; 0: at once; negative: INVALID_ARGUMENT.
	//
	// Both apply to [Streams.Append] only: a batch's entries carry their own
	// ([BatchEntry.DeliverAt], [BatchEntry.Delay]), and the batch appends
	// refuse them.
	DeliverAt time.Time
	Delay     time.Duration
}

// AppendOption is what the appends take after the fields: an [AppendOptions]
// (at most one is needed; a later one's non-zero fields win), or one of the
// deprecated [WithMaxLen], [WithPartitionKey] and [WithDedupKey].
type AppendOption interface {
	applyAppend(*AppendOptions)
}

func (o AppendOptions) applyAppend(into *AppendOptions) {
	if o.MaxLen != 0 {
		into.MaxLen = o.MaxLen
	}
	if o.PartitionKey != "" {
		into.PartitionKey = o.PartitionKey
	}
	if o.DedupKey != "" {
		into.DedupKey = o.DedupKey
	}
	if !o.DeliverAt.IsZero() {
		into.DeliverAt = o.DeliverAt
	}
	if o.Delay != 0 {
		into.Delay = o.Delay
	}
}

// appendOptionFunc is the functional option of the deprecated With… names.
type appendOptionFunc func(*AppendOptions)

func (f appendOptionFunc) applyAppend(o *AppendOptions) { f(o) }

// WithMaxLen is AppendOptions{MaxLen: n}.
//
// Deprecated: pass [AppendOptions] with MaxLen; WithMaxLen goes away in the
// next release.
func WithMaxLen(n uint64) AppendOption {
	return appendOptionFunc(func(o *AppendOptions) { o.MaxLen = n })
}

// WithPartitionKey is AppendOptions{PartitionKey: key}.
//
// Deprecated: pass [AppendOptions] with PartitionKey; WithPartitionKey goes
// away in the next release.
func WithPartitionKey(key string) AppendOption {
	return appendOptionFunc(func(o *AppendOptions) { o.PartitionKey = key })
}

// WithDedupKey is AppendOptions{DedupKey: key}.
//
// Deprecated: pass [AppendOptions] with DedupKey; WithDedupKey goes away in
// the next release.
func WithDedupKey(key string) AppendOption {
	return appendOptionFunc(func(o *AppendOptions) { o.DedupKey = key })
}

// errBatchDedupKey refuses a dedup key for a whole batch.
var errBatchDedupKey = errors.New("AppendOptions.DedupKey (WithDedupKey) applies to Append; give a batch's entries their keys in BatchEntry.DedupKey (AppendBatchEntries)")

// errBatchSchedule refuses a schedule for a whole batch.
var errBatchSchedule = errors.New("AppendOptions.DeliverAt and Delay apply to Append; give a batch's entries their schedules in BatchEntry.DeliverAt and Delay (AppendBatchEntries)")

func collect(opts []AppendOption) AppendOptions {
	var o AppendOptions
	for _, opt := range opts {
		if opt != nil {
			opt.applyAppend(&o)
		}
	}
	return o
}

// Append adds one entry with fields to stream (created if absent). A field
// named like the sidecar's reserved branded-id field (`id` by default) is
// refused with INVALID_ARGUMENT. Errors carry the gRPC status
// ([status.Code] works on them): INVALID_ARGUMENT, FAILED_PRECONDITION (the key
// holds another type), UNAVAILABLE (the entry may have been written: retry
// with the same [AppendOptions.DedupKey] to be sure of one copy). With
// [AppendOptions.DeliverAt] or Delay the entry is scheduled (see there).
//
//	res, err := streams.Append(ctx, "reminders", fields, echomq.AppendOptions{Delay: time.Hour})
func (s *Streams) Append(ctx context.Context, stream string, fields map[string][]byte, opts ...AppendOption) (AppendResult, error) {
	o := collect(opts)
	req := &pb.AppendRequest{
		Stream: stream, Fields: fields, MaxLen: o.MaxLen, PartitionKey: o.PartitionKey, DedupKey: o.DedupKey,
	}
	if !o.DeliverAt.IsZero() {
		req.DeliverAt = timestamppb.New(o.DeliverAt)
	}
	if o.Delay != 0 {
		req.Delay = durationpb.New(o.Delay)
	}
	resp, err := s.client.Append(ctx, req)
	if err != nil {
		return AppendResult{}, fmt.Errorf("echomq: append to %q: %w", stream, err)
	}
	return appended(resp), nil
}

// AppendBatch adds entries to stream in one atomic step: all or none, with
// consecutive ids in the given order. 1 to 10,000 entries. Errors as for
// [Streams.Append]. For entries with dedup keys, see
// [Streams.AppendBatchEntries].
func (s *Streams) AppendBatch(ctx context.Context, stream string, entries []map[string][]byte, opts ...AppendOption) ([]AppendResult, error) {
	batch := make([]*pb.BatchEntry, len(entries))
	for i, fields := range entries {
		batch[i] = &pb.BatchEntry{Fields: fields}
	}
	return s.appendBatch(ctx, stream, batch, opts)
}

// AppendBatchEntries is [Streams.AppendBatch] for entries that may carry a
// dedup key each. An entry whose key is recorded on the stream, or was used
// by an earlier entry of the same batch, is not written: its result is the
// first one's, with [AppendResult.Duplicate] set (it takes no id of its own).
// An entry with [BatchEntry.DeliverAt] or Delay is scheduled (see
// [AppendOptions.DeliverAt]); its result has [AppendResult.Scheduled] set.
// On a sharded stream, a batch without [AppendOptions.PartitionKey] goes to the shard
// of its first dedup key. Errors as for [Streams.Append].
func (s *Streams) AppendBatchEntries(ctx context.Context, stream string, entries []BatchEntry, opts ...AppendOption) ([]AppendResult, error) {
	batch := make([]*pb.BatchEntry, len(entries))
	for i, e := range entries {
		batch[i] = e.request()
	}
	return s.appendBatch(ctx, stream, batch, opts)
}

func (s *Streams) appendBatch(ctx context.Context, stream string, entries []*pb.BatchEntry, opts []AppendOption) ([]AppendResult, error) {
	o := collect(opts)
	if o.DedupKey != "" {
		return nil, fmt.Errorf("echomq: append %d entries to %q: %w", len(entries), stream, errBatchDedupKey)
	}
	if !o.DeliverAt.IsZero() || o.Delay != 0 {
		return nil, fmt.Errorf("echomq: append %d entries to %q: %w", len(entries), stream, errBatchSchedule)
	}
	req := &pb.AppendBatchRequest{Stream: stream, MaxLen: o.MaxLen, PartitionKey: o.PartitionKey, Entries: entries}
	resp, err := s.client.AppendBatch(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("echomq: append %d entries to %q: %w", len(entries), stream, err)
	}
	out := make([]AppendResult, len(resp.GetEntries()))
	for i, e := range resp.GetEntries() {
		out[i] = appended(e)
	}
	return out, nil
}

func appended(resp *pb.AppendResponse) AppendResult {
	return AppendResult{ID: resp.GetId(), StreamID: resp.GetStreamId(), Stream: resp.GetStream(), Duplicate: resp.GetDuplicate(), Scheduled: resp.GetScheduled()}
}
