package echomq

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// Producer appends entries to streams through the sidecar, which mints each
// entry's branded id on the Redis host, atomically with the XADD.
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
}

// AppendOption tunes an append.
type AppendOption func(*appendOptions)

type appendOptions struct {
	maxLen       uint64
	partitionKey string
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
// holds another type), UNAVAILABLE (retry).
func (p *Producer) Append(ctx context.Context, stream string, fields map[string][]byte, opts ...AppendOption) (Appended, error) {
	o := collect(opts)
	resp, err := p.client.Append(ctx, &pb.AppendRequest{Stream: stream, Fields: fields, MaxLen: o.maxLen, PartitionKey: o.partitionKey})
	if err != nil {
		return Appended{}, fmt.Errorf("echomq: append to %q: %w", stream, err)
	}
	return appended(resp), nil
}

// AppendBatch adds entries to stream in one atomic step: all or none, with
// consecutive ids in the given order. 1 to 10,000 entries. Errors as for
// [Producer.Append].
func (p *Producer) AppendBatch(ctx context.Context, stream string, entries []map[string][]byte, opts ...AppendOption) ([]Appended, error) {
	o := collect(opts)
	req := &pb.AppendBatchRequest{
		Stream: stream, MaxLen: o.maxLen, PartitionKey: o.partitionKey, Entries: make([]*pb.BatchEntry, len(entries)),
	}
	for i, fields := range entries {
		req.Entries[i] = &pb.BatchEntry{Fields: fields}
	}
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
	return Appended{ID: resp.GetId(), StreamID: resp.GetStreamId(), Stream: resp.GetStream()}
}
