package echomq

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// ErrNotScheduled is what [Streams.CancelScheduled] returns (wrapped with the
// sidecar's NOT_FOUND status, so [status.Code] works too) when no such entry
// is scheduled on that stream key: it entered the stream already (a cancel
// and a move race, and exactly one wins), was cancelled, or was never
// scheduled there.
var ErrNotScheduled = errors.New("echomq: no such entry is scheduled")

// CancelScheduled removes the scheduled entry with branded id id from stream
// before it enters the stream: it is then never delivered. stream is the key
// the append answered ([AppendResult.Stream]: a sharded stream's shard key).
// It returns when the entry was due.
//
// Errors: [ErrNotScheduled] (with status NOT_FOUND) when nothing by that id
// is scheduled there; otherwise the gRPC status: INVALID_ARGUMENT for a bad
// stream name or an id that is not a branded id, UNAVAILABLE when Redis
// cannot be reached.
//
//	if _, err := streams.CancelScheduled(ctx, res.Stream, res.ID); errors.Is(err, echomq.ErrNotScheduled) {
//		// too late: it is in the stream (or was cancelled)
//	}
func (s *Streams) CancelScheduled(ctx context.Context, stream, id string) (time.Time, error) {
	resp, err := s.client.CancelScheduled(ctx, &pb.CancelScheduledRequest{Stream: stream, Id: id})
	if status.Code(err) == codes.NotFound {
		return time.Time{}, fmt.Errorf("echomq: cancel %s on %q: %w (%w)", id, stream, ErrNotScheduled, err)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("echomq: cancel %s on %q: %w", id, stream, err)
	}
	return resp.GetDeliverAt().AsTime(), nil
}

// ListScheduledOptions pages through [Streams.ListScheduled]. The zero value
// is the first page of the sidecar's default size.
type ListScheduledOptions struct {
	// PageToken is where to continue: the previous page's
	// [ScheduledPage.NextPageToken]. "": from the entry due first.
	PageToken string
	// Count is the page size (entries). 0: 100. Above 10,000: INVALID_ARGUMENT.
	Count uint32
}

// ScheduledEntry is an entry waiting for its time.
type ScheduledEntry struct {
	// ID is its branded id, as the append answered it.
	ID string
	// DeliverAt is when it is due to enter the stream.
	DeliverAt time.Time
	// Fields are its fields as appended (with the stored traceparent, if any).
	Fields map[string][]byte
}

// ScheduledPage is one page of [Streams.ListScheduled].
type ScheduledPage struct {
	// Entries, the first due first (then by branded id).
	Entries []ScheduledEntry
	// NextPageToken continues the listing ([ListScheduledOptions.PageToken]);
	// "" when this page is the last.
	NextPageToken string
	// Total is how many entries the stream key has scheduled in all.
	Total uint64
}

// ListScheduled returns one page of the entries scheduled on stream (a
// stream key: list each shard key of a sharded stream) that have not entered
// it yet, the first due first.
//
// Errors carry the gRPC status: INVALID_ARGUMENT for a bad stream name, a
// malformed page token or Count over 10,000; UNAVAILABLE when Redis cannot be
// reached.
func (s *Streams) ListScheduled(ctx context.Context, stream string, o ListScheduledOptions) (ScheduledPage, error) {
	resp, err := s.client.ListScheduled(ctx, &pb.ListScheduledRequest{Stream: stream, PageToken: o.PageToken, Count: o.Count})
	if err != nil {
		return ScheduledPage{}, fmt.Errorf("echomq: list scheduled on %q: %w", stream, err)
	}
	page := ScheduledPage{
		Entries:       make([]ScheduledEntry, len(resp.GetEntries())),
		NextPageToken: resp.GetNextPageToken(),
		Total:         resp.GetTotal(),
	}
	for i, e := range resp.GetEntries() {
		fields := e.GetFields()
		if fields == nil {
			fields = map[string][]byte{}
		}
		page.Entries[i] = ScheduledEntry{ID: e.GetId(), DeliverAt: e.GetDeliverAt().AsTime(), Fields: fields}
	}
	return page, nil
}

// Scheduled iterates over every entry scheduled on stream, the first due first,
// a page of o.Count entries at a time (following NextPageToken, from
// o.PageToken). An error ends the iteration: it is yielded once, with a zero
// ScheduledEntry.
//
//	for e, err := range streams.Scheduled(ctx, "reminders", echomq.ListScheduledOptions{}) {
//		if err != nil {
//			return err
//		}
//		fmt.Println(e.ID, e.DeliverAt)
//	}
func (s *Streams) Scheduled(ctx context.Context, stream string, o ListScheduledOptions) iter.Seq2[ScheduledEntry, error] {
	return func(yield func(ScheduledEntry, error) bool) {
		for {
			page, err := s.ListScheduled(ctx, stream, o)
			if err != nil {
				yield(ScheduledEntry{}, err)
				return
			}
			for _, e := range page.Entries {
				if !yield(e, nil) {
					return
				}
			}
			if page.NextPageToken == "" {
				return
			}
			o.PageToken = page.NextPageToken
		}
	}
}
