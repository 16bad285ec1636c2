package echomq

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// Handler handles one delivery. Returning nil acknowledges it; returning an
// error fails it with err.Error() as the reason, and the sidecar delivers it
// again after the subscription's retry backoff: an attempt spent, unless the
// error is (or wraps) [Transient] (no attempt spent) or [Poison]
// (dead-lettered now). A handler that settles the
// delivery itself ([Delivery.Ack], [Delivery.Fail], [Delivery.DeadLetter]) is
// not settled again, whatever it returns; nor is one it answered with
// [Delivery.AckEmit] (consume → produce, exactly once), unless the sidecar
// refused that for a bad emit. A panic is recovered and fails the entry like
// an error.
//
// ctx is cancelled when the delivery can no longer be settled: its call ended
// (the entry will come back; [context.Cause] of ctx is [ErrCallEnded]), the
// sidecar reported its lease lost to a peer ([CodeLeaseLost]; the cause is
// [ErrLeaseLost], and no verdict is sent for the delivery, whatever the
// handler returns), Run's context was cancelled, or the Stop deadline passed.
// It is valid until the handler returns: the handler's worker reuses it for
// its next delivery, so do not keep it (or cancel-sensitive work on it) past
// the return.
type Handler func(ctx context.Context, d *Delivery) error

// BatchHandler handles the deliveries of one frame at once: 1 to
// [FlowControl.MaxBatch] of them, in delivery order, as the sidecar sent
// them (a batch never waits to fill: at low rates it holds one delivery). Run
// it with [Consumer.RunBatch].
//
// The verdicts are the returned slice: nil acknowledges every delivery;
// otherwise it must have one entry per delivery, where a nil error
// acknowledges batch[i] and an error fails it with err.Error() as the reason
// (delivered again after the retry backoff), of the kind its type says, as
// for [Handler]. Deliveries the handler settled
// itself ([Delivery.Ack], [Delivery.Fail], [Delivery.DeadLetter],
// [Delivery.AckEmit]) keep that verdict. A slice of the wrong length or a panic fails every delivery not
// settled yet.
//
// ctx is cancelled when the batch's call ended, Run's context was cancelled,
// or the Stop deadline passed; as for [Handler], it is valid until the
// handler returns. A lease lost by one entry of the batch does not cancel it
// (the others are still held): that delivery's [Delivery.LeaseLost] turns
// true, its explicit verdicts return [ErrLeaseLost], and no verdict is sent
// for it, whatever the handler returns.
type BatchHandler func(ctx context.Context, batch []*Delivery) []error

// RawField is an entry field whose name is not valid UTF-8 (a proto map key
// must be), byte for byte.
type RawField struct {
	Name, Value []byte
}

// verdict is how a delivery was settled.
type verdict int32

const (
	unsettled verdict = iota
	acked
	failed
	deadLettered
	// lost: the sidecar reported the lease lost (LEASE_LOST); no verdict may
	// follow.
	lost
	// ackEmitted: an AckEmit was sent; it is unsettled again if the sidecar
	// refuses it for a bad emit.
	ackEmitted
	// released: never handed to a handler, given back to the group by the
	// consumer's graceful stop (a Release); no verdict may follow.
	released
)

// verdictSender is the Consume call a delivery came on; only that call may
// carry its verdict.
type verdictSender interface {
	send(*pb.ConsumeRequest) error
	// ack queues the acknowledgement of id, to be coalesced with others into
	// one Ack message.
	ack(id string) error
	// ackEmit sends an AckEmit (never coalesced) and waits for its answer.
	ackEmit(req *pb.ConsumeRequest) (emitAnswer, error)
	// reheld counts a delivery held again after a refused AckEmit.
	reheld()
}

// Delivery is one hand-over of a stream entry to this consumer. Settle it at
// most once; the handler's return value settles it otherwise.
type Delivery struct {
	// ID is the branded id: 28 lowercase hex characters, stable across copies
	// (dead letters, replays). The idempotency key; ordering the text orders
	// the entries.
	ID string
	// StreamID is the entry's id in this stream, `<ms>-<seq>`.
	StreamID string
	// Stream is the stream key.
	Stream string
	// Group is the consumer group.
	Group string
	// Payload maps field names to values, without the reserved branded-id field.
	Payload map[string][]byte
	// RawFields holds the fields whose names are not valid UTF-8, in stream
	// order. Usually empty.
	RawFields []RawField
	// Attempts is the entry's delivery count in the group (1 on the first
	// delivery, one more on each hand-over since), not a count of handler errors.
	Attempts uint32
	// MintedAt is when the branded id was minted (millisecond precision).
	MintedAt time.Time
	// Traceparent is the W3C trace context stored with the entry, or "".
	Traceparent string

	call    verdictSender
	settled atomic.Int32
}

func newDelivery(call verdictSender, m *pb.Delivery) *Delivery {
	d := &Delivery{}
	d.fill(call, m)
	return d
}

// fill sets d from m; d is fresh (deliveries of one frame share one slab).
func (d *Delivery) fill(call verdictSender, m *pb.Delivery) {
	d.ID = m.GetId()
	d.StreamID = m.GetStreamId()
	d.Stream = m.GetStream()
	d.Group = m.GetGroup()
	d.Payload = m.GetPayload()
	d.Attempts = m.GetAttempts()
	d.Traceparent = m.GetTraceparent()
	d.call = call
	if d.Payload == nil {
		d.Payload = map[string][]byte{}
	}
	if m.GetMintedAt() != nil {
		d.MintedAt = m.GetMintedAt().AsTime()
	}
	for _, f := range m.GetRawFields() {
		d.RawFields = append(d.RawFields, RawField{Name: f.GetName(), Value: f.GetValue()})
	}
}

// Ack acknowledges the delivery: the sidecar XACKs it and it is gone for good.
// Acks are coalesced: the consumer sends the acks of a short window
// ([ConsumerConfig.AckLinger], [ConsumerConfig.AckBatch]) in one Ack message,
// and [Consumer.Stop] sends them before it returns, also past its deadline. It returns [ErrAlreadySettled] after an earlier verdict and [ErrCallEnded]
// when the call it came on has ended (nothing is sent; it will come back),
// [ErrLeaseLost] after the sidecar reported its lease lost (nothing is sent).
// The sidecar reports a verdict it could not apply through
// [ConsumerConfig.OnVerdictError].
func (d *Delivery) Ack() error {
	if err := d.settle(acked); err != nil {
		return err
	}
	return d.call.ack(d.ID)
}

// Fail reports that the delivery could not be handled: the entry stays pending
// and is delivered again after retryAfter, or after the subscription's
// exponential backoff when retryAfter is zero (a negative value counts as
// zero). reason (at most 4096 bytes kept) is logged by the sidecar and kept
// for a later dead letter.
//
// kind, at most one, says whose fault it was: [FailKindMessage] when left
// out (an attempt spent), [FailKindTransient] (the database is down: no
// attempt spent), [FailKindPoison] (dead-lettered now). More than one kind is
// a programming error: nothing is sent and the delivery stays unsettled.
// Other errors as for [Delivery.Ack].
func (d *Delivery) Fail(reason string, retryAfter time.Duration, kind ...FailKind) error {
	if len(kind) > 1 {
		return fmt.Errorf("echomq: Fail takes at most one FailKind, got %d", len(kind))
	}
	k := FailKindMessage
	if len(kind) == 1 {
		k = kind[0]
	}
	if err := d.settle(failed); err != nil {
		return err
	}
	return d.call.send(failRequest(d.ID, reason, retryAfter, k, false))
}

// DeadLetter moves the entry to the subscription's dead-letter stream now
// (default `<stream>:dlq`), with its branded id, payload and reason, and
// acknowledges it on the source: a Fail of [FailKindPoison], sent with the
// older dead_letter flag too, so that a sidecar that predates the kinds does
// the same. Errors as for [Delivery.Ack].
func (d *Delivery) DeadLetter(reason string) error {
	if err := d.settle(deadLettered); err != nil {
		return err
	}
	return d.call.send(failRequest(d.ID, reason, 0, FailKindPoison, true))
}

// failRequest is the one place a Fail is built, so every fail, returned or
// explicit, carries its kind.
func failRequest(id, reason string, retryAfter time.Duration, kind FailKind, deadLetter bool) *pb.ConsumeRequest {
	f := &pb.Fail{Id: id, Reason: reason, Kind: kind, DeadLetter: deadLetter}
	if retryAfter > 0 {
		f.RetryAfter = durationpb.New(retryAfter)
	}
	return &pb.ConsumeRequest{Kind: &pb.ConsumeRequest_Fail{Fail: f}}
}

// Extend pushes the delivery's ack deadline ([ConsumerConfig.AckDeadline]) to
// now + by. Without an ack deadline it is not needed: while the call holds a
// delivery the sidecar keeps it from being reclaimed by peers.
func (d *Delivery) Extend(by time.Duration) error {
	switch d.verdict() {
	case unsettled:
	case lost:
		return ErrLeaseLost
	default:
		return ErrAlreadySettled
	}
	e := &pb.Extend{Ids: []string{d.ID}, By: durationpb.New(by)}
	return d.call.send(&pb.ConsumeRequest{Kind: &pb.ConsumeRequest_Extend{Extend: e}})
}

// Settled reports whether d needs no more verdict: one has been given, or
// its lease was lost ([Delivery.LeaseLost]).
func (d *Delivery) Settled() bool { return d.settled.Load() != int32(unsettled) }

// LeaseLost reports whether the sidecar reported d's lease lost
// ([CodeLeaseLost]) before a verdict was given: a peer has the entry, and no
// verdict is sent for d. A [Handler] also sees it as its ctx's cancellation
// with cause [ErrLeaseLost].
func (d *Delivery) LeaseLost() bool { return d.verdict() == lost }

// settle records v as d's verdict, or says why it cannot be given.
func (d *Delivery) settle(v verdict) error {
	if d.settled.CompareAndSwap(int32(unsettled), int32(v)) {
		return nil
	}
	if d.verdict() == lost {
		return ErrLeaseLost
	}
	return ErrAlreadySettled
}

// lose marks d's lease lost; false if a verdict came first (it stands: the
// sidecar applies it or answers NOT_PENDING).
func (d *Delivery) lose() bool {
	return d.settled.CompareAndSwap(int32(unsettled), int32(lost))
}

func (d *Delivery) verdict() verdict { return verdict(d.settled.Load()) }
