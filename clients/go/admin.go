package echomq

import (
	"context"
	"fmt"
	"iter"
	"time"

	"google.golang.org/grpc"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// Admin shows what is stuck in a group and moves dead letters back, through
// the sidecar's AdminService.
type Admin struct {
	client pb.AdminServiceClient
}

// NewAdmin returns an Admin on conn (from [Dial], or your own). It does not own
// conn.
func NewAdmin(conn grpc.ClientConnInterface) *Admin {
	return &Admin{client: pb.NewAdminServiceClient(conn)}
}

// GroupInfo is a consumer group's state (XINFO GROUPS, XINFO CONSUMERS,
// XPENDING, XLEN).
type GroupInfo struct {
	// Stream is the stream key; Group the group.
	Stream, Group string
	// Pending is the number of entries delivered and not yet acknowledged
	// (the PEL's size).
	Pending uint64
	// Lag is the number of entries appended that the group has not read yet
	// (XINFO GROUPS `lag`); meaningful only when LagKnown (Redis cannot always
	// say: after XDEL or trimming, or before Redis 7.0).
	Lag      uint64
	LagKnown bool
	// LastDeliveredID is the group's last-delivered stream id.
	LastDeliveredID string
	// Consumers are the group's consumers.
	Consumers []ConsumerInfo
	// OldestPendingID is the oldest pending entry's stream id; "" when
	// nothing is pending.
	OldestPendingID string
	// OldestPendingAge is how long ago the oldest pending entry was appended
	// (from its stream id's milliseconds); 0 when nothing is pending.
	OldestPendingAge time.Duration
	// MaxDeliveryCount is the highest delivery count among the oldest 10,000
	// pending entries.
	MaxDeliveryCount uint64
	// StreamLength is the number of entries in the stream (XLEN).
	StreamLength uint64
	// Shards, for a sharded stream, is each shard's state in shard order
	// (Stream is the shard's key); the fields above then add up the shards
	// (LastDeliveredID is ""). Empty for a plain stream.
	Shards []GroupInfo
	// KeyedEntries, for a group with per-key limits
	// ([ConsumerConfig].KeyField), is the number of its pending entries that
	// hold or wait for their key; 0 when the group has no key field.
	KeyedEntries uint64
	// BusyKeys are the keys with entries held or waiting, the busiest first:
	// at most 100, from the first 10,000 keyed entries.
	BusyKeys []BusyKey
}

// BusyKey is a key of a group with per-key limits that has entries pending
// ([GroupInfo].BusyKeys).
type BusyKey struct {
	// Key is the value of the group's key field, as stored.
	Key []byte
	// Entries is the number of its entries pending in the group, held or
	// waiting for the key.
	Entries uint64
	// HeadID is the stream id of its oldest pending entry: the one that runs
	// first.
	HeadID string
	// HeadConsumer is the consumer whose PEL holds that entry.
	HeadConsumer string
}

// ConsumerInfo is one consumer of a group.
type ConsumerInfo struct {
	// Name is the consumer name (a sidecar's `--consumer-name`).
	Name string
	// Pending is the number of entries in its PEL.
	Pending uint64
	// Idle is the time since it last read or claimed (XINFO CONSUMERS `idle`).
	Idle time.Duration
}

func groupInfoFrom(m *pb.DescribeGroupResponse) GroupInfo {
	g := GroupInfo{
		Stream:           m.GetStream(),
		Group:            m.GetGroup(),
		Pending:          m.GetPending(),
		Lag:              m.GetLag(),
		LagKnown:         m.Lag != nil,
		LastDeliveredID:  m.GetLastDeliveredId(),
		OldestPendingID:  m.GetOldestPendingId(),
		MaxDeliveryCount: m.GetMaxDeliveryCount(),
		StreamLength:     m.GetStreamLength(),
		KeyedEntries:     m.GetKeyedEntries(),
	}
	if age := m.GetOldestPendingAge(); age != nil {
		g.OldestPendingAge = age.AsDuration()
	}
	for _, c := range m.GetConsumers() {
		info := ConsumerInfo{Name: c.GetName(), Pending: c.GetPending()}
		if c.GetIdle() != nil {
			info.Idle = c.GetIdle().AsDuration()
		}
		g.Consumers = append(g.Consumers, info)
	}
	for _, s := range m.GetShards() {
		g.Shards = append(g.Shards, groupInfoFrom(s))
	}
	for _, k := range m.GetBusyKeys() {
		g.BusyKeys = append(g.BusyKeys, BusyKey{Key: k.GetKey(), Entries: k.GetEntries(), HeadID: k.GetHeadId(), HeadConsumer: k.GetHeadConsumer()})
	}
	return g
}

// DescribeGroup reports the state of group on stream (a stream key, or the
// name of a sharded stream: then the answer sums its shards and lists each in
// Shards).
//
// Errors carry the gRPC status ([status.Code] works on them):
// INVALID_ARGUMENT for an empty stream or group (or a sharded stream's name
// that the sidecar was not started with); NOT_FOUND when the stream or the
// group does not exist; FAILED_PRECONDITION when the key is not a stream;
// UNAVAILABLE when Redis cannot be reached (retry).
func (a *Admin) DescribeGroup(ctx context.Context, stream, group string) (GroupInfo, error) {
	resp, err := a.client.DescribeGroup(ctx, &pb.DescribeGroupRequest{Stream: stream, Group: group})
	if err != nil {
		return GroupInfo{}, fmt.Errorf("echomq: describe group %q of %q: %w", group, stream, err)
	}
	return groupInfoFrom(resp), nil
}

// DeadLetter is one entry of a dead-letter stream.
type DeadLetter struct {
	// Entry is the entry as it sits in the dead-letter stream: Entry.ID is the
	// original branded id, Entry.StreamID its dead-letter stream id (what
	// [ReplayOptions.IDs] names), Entry.Payload the original payload, without
	// the `echomq.*` metadata fields.
	Entry Entry
	// SourceStream is the stream it came from; SourceID its stream id there.
	SourceStream, SourceID string
	// Group is the group that gave up on it.
	Group string
	// Attempts is its delivery count when it was dead-lettered.
	Attempts uint32
	// Reason is the last failure reason.
	Reason string
	// DeadLetteredAt is when it was dead-lettered.
	DeadLetteredAt time.Time
}

// DeadLetterRange is which dead letters to list.
type DeadLetterRange struct {
	// DeadLetterStream is the dead-letter stream. "": the stream's default,
	// `<stream>:dlq` (`{<stream>}:dlq` on a Redis Cluster when the name has
	// no hash tag). For a sharded stream, name a shard's: each has its own.
	DeadLetterStream string
	// StartID is the first dead-letter stream id to return (inclusive). "":
	// the oldest.
	StartID string
	// Count is the page size (dead letters). 0: 100. Above 10,000:
	// INVALID_ARGUMENT.
	Count uint32
}

// DeadLetterPage is one page of dead letters.
type DeadLetterPage struct {
	// DeadLetters, oldest first.
	DeadLetters []DeadLetter
	// NextStartID is the StartID of the next page; "" at the end. A page
	// holds fewer than Count dead letters when more would not fit in one gRPC
	// message.
	NextStartID string
	// OversizedIDs are dead-letter stream ids of dead letters too large for
	// one gRPC message on their own: left out (replaying them still works).
	OversizedIDs []string
}

// ListDeadLetters returns one page of the dead letters of stream (the source
// stream; with r.DeadLetterStream set, it may be ""), oldest first (XRANGE).
// Follow [DeadLetterPage.NextStartID], or use [Admin.DeadLetters].
//
// Errors carry the gRPC status, as for [Streams.Read]: INVALID_ARGUMENT for a
// bad name or id or Count over 10,000; FAILED_PRECONDITION when the key is
// not a stream; UNAVAILABLE when Redis cannot be reached. A dead-letter
// stream that does not exist lists as empty.
func (a *Admin) ListDeadLetters(ctx context.Context, stream string, r DeadLetterRange) (DeadLetterPage, error) {
	resp, err := a.client.ListDeadLetters(ctx, &pb.ListDeadLettersRequest{
		Stream: stream, DeadLetterStream: r.DeadLetterStream, StartId: r.StartID, Count: r.Count,
	})
	if err != nil {
		return DeadLetterPage{}, fmt.Errorf("echomq: list dead letters of %q: %w", stream, err)
	}
	page := DeadLetterPage{
		DeadLetters:  make([]DeadLetter, len(resp.GetDeadLetters())),
		NextStartID:  resp.GetNextStartId(),
		OversizedIDs: resp.GetOversizedIds(),
	}
	for i, m := range resp.GetDeadLetters() {
		dl := DeadLetter{
			Entry:        entryFrom(m.GetEntry()),
			SourceStream: m.GetSourceStream(),
			SourceID:     m.GetSourceId(),
			Group:        m.GetGroup(),
			Attempts:     m.GetAttempts(),
			Reason:       m.GetReason(),
		}
		if m.GetDeadLetteredAt() != nil {
			dl.DeadLetteredAt = m.GetDeadLetteredAt().AsTime()
		}
		page.DeadLetters[i] = dl
	}
	return page, nil
}

// DeadLetters iterates over every dead letter of stream from r.StartID on,
// oldest first, a page of r.Count at a time. An error ends the iteration: it
// is yielded once, with a zero DeadLetter.
func (a *Admin) DeadLetters(ctx context.Context, stream string, r DeadLetterRange) iter.Seq2[DeadLetter, error] {
	return func(yield func(DeadLetter, error) bool) {
		for {
			page, err := a.ListDeadLetters(ctx, stream, r)
			if err != nil {
				yield(DeadLetter{}, err)
				return
			}
			for _, dl := range page.DeadLetters {
				if !yield(dl, nil) {
					return
				}
			}
			if page.NextStartID == "" {
				return
			}
			if page.NextStartID == r.StartID && len(page.DeadLetters) == 0 {
				yield(DeadLetter{}, fmt.Errorf("echomq: list dead letters of %q: the next page starts where this one did (%s)", stream, r.StartID))
				return
			}
			r.StartID = page.NextStartID
		}
	}
}

// ReplayOptions says which dead letters to replay.
type ReplayOptions struct {
	// DeadLetterStream is the dead-letter stream. "": the stream's default,
	// as for [DeadLetterRange].
	DeadLetterStream string
	// IDs are the dead-letter stream ids ([DeadLetter].Entry.StreamID) to
	// replay. Empty: the oldest Count.
	IDs []string
	// Count, with no IDs, is how many of the oldest to replay. 0: 100. Above
	// 10,000: INVALID_ARGUMENT.
	Count uint32
}

// Replayed is one dead letter moved back to its source stream.
type Replayed struct {
	// ID is the branded id, unchanged (for a dead letter written without one,
	// the id consumers get from its new stream id).
	ID string
	// DeadLetterID is the id it had in the dead-letter stream.
	DeadLetterID string
	// StreamID is its new stream id in the source stream.
	StreamID string
}

// Replay is the old name of [ReplayResult].
//
// Deprecated: use [ReplayResult], the name every client gives it; Replay goes
// away in the next release.
type Replay = ReplayResult

// ReplayResult is what [Admin.ReplayDeadLetters] did.
type ReplayResult struct {
	// Replayed are the entries moved, in order.
	Replayed []Replayed
	// NotFoundIDs are requested IDs not in the dead-letter stream (already
	// replayed, or never there): nothing was done for them.
	NotFoundIDs []string
	// OtherSourceIDs are dead letters (requested, or among the oldest Count)
	// whose source is another stream sharing this dead-letter stream: left in
	// place (replay them by naming that stream).
	OtherSourceIDs []string
}

// ReplayDeadLetters moves dead letters back to stream, their source: each is
// appended there (a new stream id, the same branded id, the original
// payload) and deleted from the dead-letter stream in one script on the Redis
// host, so a crash neither loses nor duplicates one. A replayed entry is a
// new entry of the stream: every group reads it, also one that had
// acknowledged it (the branded id tells it apart: see [SkipSeen]).
//
// Errors carry the gRPC status: INVALID_ARGUMENT for a bad name or id, or a
// dead-letter stream equal to stream; FAILED_PRECONDITION when a key is not a
// stream, when stream does not exist or has no consumer group (the entries
// would reach no one), or when a dead letter holds nothing but `echomq.*`
// metadata; UNAVAILABLE when Redis cannot be reached. Entries move 100 at a
// time: an error after the first batch says how many moved before it, and a
// call cancelled part-way (ctx) keeps what moved.
func (a *Admin) ReplayDeadLetters(ctx context.Context, stream string, o ReplayOptions) (ReplayResult, error) {
	resp, err := a.client.ReplayDeadLetters(ctx, &pb.ReplayDeadLettersRequest{
		Stream: stream, DeadLetterStream: o.DeadLetterStream, Ids: o.IDs, Count: o.Count,
	})
	if err != nil {
		return ReplayResult{}, fmt.Errorf("echomq: replay dead letters to %q: %w", stream, err)
	}
	out := ReplayResult{NotFoundIDs: resp.GetNotFoundIds(), OtherSourceIDs: resp.GetOtherSourceIds()}
	for _, r := range resp.GetReplayed() {
		out.Replayed = append(out.Replayed, Replayed{ID: r.GetId(), DeadLetterID: r.GetDeadLetterId(), StreamID: r.GetStreamId()})
	}
	return out, nil
}
