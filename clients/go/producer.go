package echomq

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// Producer appends entries to streams through the sidecar, which mints each
// entry's branded id on the Redis host, atomically with the XADD.
//
// A Producer retries nothing. An append that fails with UNAVAILABLE (Redis
// unreachable, a failover, the sidecar's --wait-replicas not confirmed) or
// DEADLINE_EXCEEDED, or whose call was cut off, may have been written; a
// plain retry could write it twice. Give it a dedup key ([WithDedupKey], or
// [BatchEntry.DedupKey]) and retry with the same key: if the first attempt
// was written, the retry writes nothing and answers its ids with
// [Appended.Duplicate] set (see the example of [Producer.Append]).
type Producer struct {
	client pb.StreamServiceClient
}

// NewProducer returns a producer on conn (from [Dial], or your own). It does
// not own conn.
func NewProducer(conn grpc.ClientConnInterface) *Producer {
	return &Producer{client: pb.NewStreamServiceClient(conn)}
}

// Appended is what an append wrote.
type Appended struct {
	// ID is the branded id, 28 lowercase hex characters.
	ID string
	// StreamID is the entry's stream id, `<ms>-<seq>`.
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
}

// BatchEntry is one entry of [Producer.AppendBatchEntries]: its fields and,
// optionally, its dedup key (as [WithDedupKey]; "" for none). A batch may mix
// entries with and without keys.
type BatchEntry struct {
	Fields   map[string][]byte
	DedupKey string
}

// AppendOption tunes an append.
type AppendOption func(*appendOptions)

type appendOptions struct {
	maxLen       uint64
	partitionKey string
	dedupKey     string
}

// WithMaxLen trims the stream to about n entries as part of the XADD
// (`MAXLEN ~ n`: Redis trims whole nodes, so a few more may stay). Without it,
// nothing is trimmed.
func WithMaxLen(n uint64) AppendOption {
	return func(o *appendOptions) { o.maxLen = n }
}

// WithPartitionKey picks the shard of a sharded stream (the sidecar's
// --sharded-streams): entries with the same key go to the same shard, so they
// are consumed in the order they were appended. Without it (or with ""), the
// shards are taken in turn. A stream that is not sharded ignores it. A batch
// goes to one shard as a whole.
func WithPartitionKey(key string) AppendOption {
	return func(o *appendOptions) { o.partitionKey = key }
}

// WithDedupKey makes an append idempotent: if an append to the same stream
// with the same key was recorded within the sidecar's --dedup-window-ms (2
// minutes by default), nothing is written and the answer is that append's,
// with [Appended.Duplicate] set. So an append whose outcome is unknown
// (UNAVAILABLE, DEADLINE_EXCEEDED, a lost connection) can be retried with the
// same key without a second copy. "" (the default): no deduplication. A key
// over the sidecar's --max-name-bytes (1024) is INVALID_ARGUMENT. On a
// sharded stream, retry with the same [WithPartitionKey] (or none).
//
// It applies to [Producer.Append] only: a batch's entries carry their own
// keys ([BatchEntry.DedupKey]), and [Producer.AppendBatch] and
// [Producer.AppendBatchEntries] refuse it.
func WithDedupKey(key string) AppendOption {
	return func(o *appendOptions) { o.dedupKey = key }
}

// errBatchDedupKey refuses WithDedupKey on a batch.
var errBatchDedupKey = errors.New("WithDedupKey applies to Append; give a batch's entries their keys in BatchEntry.DedupKey (AppendBatchEntries)")

func collect(opts []AppendOption) appendOptions {
	var o appendOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Append adds one entry with fields to stream (created if absent). A field
// named like the sidecar's reserved branded-id field (`id` by default) is
// refused with INVALID_ARGUMENT. Errors carry the gRPC status
// ([status.Code] works on them): INVALID_ARGUMENT, FAILED_PRECONDITION (the key
// holds another type), UNAVAILABLE (the entry may have been written: retry
// with the same [WithDedupKey] to be sure of one copy).
func (p *Producer) Append(ctx context.Context, stream string, fields map[string][]byte, opts ...AppendOption) (Appended, error) {
	o := collect(opts)
	resp, err := p.client.Append(ctx, &pb.AppendRequest{
		Stream: stream, Fields: fields, MaxLen: o.maxLen, PartitionKey: o.partitionKey, DedupKey: o.dedupKey,
	})
	if err != nil {
		return Appended{}, fmt.Errorf("echomq: append to %q: %w", stream, err)
	}
	return appended(resp), nil
}

// AppendBatch adds entries to stream in one atomic step: all or none, with
// consecutive ids in the given order. 1 to 10,000 entries. Errors as for
// [Producer.Append]. For entries with dedup keys, see
// [Producer.AppendBatchEntries].
func (p *Producer) AppendBatch(ctx context.Context, stream string, entries []map[string][]byte, opts ...AppendOption) ([]Appended, error) {
	batch := make([]*pb.BatchEntry, len(entries))
	for i, fields := range entries {
		batch[i] = &pb.BatchEntry{Fields: fields}
	}
	return p.appendBatch(ctx, stream, batch, opts)
}

// AppendBatchEntries is [Producer.AppendBatch] for entries that may carry a
// dedup key each. An entry whose key is recorded on the stream, or was used
// by an earlier entry of the same batch, is not written: its result is the
// first one's, with [Appended.Duplicate] set (it takes no id of its own).
// On a sharded stream, a batch without [WithPartitionKey] goes to the shard
// of its first dedup key. Errors as for [Producer.Append].
func (p *Producer) AppendBatchEntries(ctx context.Context, stream string, entries []BatchEntry, opts ...AppendOption) ([]Appended, error) {
	batch := make([]*pb.BatchEntry, len(entries))
	for i, e := range entries {
		batch[i] = &pb.BatchEntry{Fields: e.Fields, DedupKey: e.DedupKey}
	}
	return p.appendBatch(ctx, stream, batch, opts)
}

func (p *Producer) appendBatch(ctx context.Context, stream string, entries []*pb.BatchEntry, opts []AppendOption) ([]Appended, error) {
	o := collect(opts)
	if o.dedupKey != "" {
		return nil, fmt.Errorf("echomq: append %d entries to %q: %w", len(entries), stream, errBatchDedupKey)
	}
	req := &pb.AppendBatchRequest{Stream: stream, MaxLen: o.maxLen, PartitionKey: o.partitionKey, Entries: entries}
	resp, err := p.client.AppendBatch(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("echomq: append %d entries to %q: %w", len(entries), stream, err)
	}
	out := make([]Appended, len(resp.GetEntries()))
	for i, e := range resp.GetEntries() {
		out[i] = appended(e)
	}
	return out, nil
}

func appended(resp *pb.AppendResponse) Appended {
	return Appended{ID: resp.GetId(), StreamID: resp.GetStreamId(), Stream: resp.GetStream(), Duplicate: resp.GetDuplicate()}
}
