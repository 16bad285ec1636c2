package echomq

import (
	"fmt"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// Emit is one entry [Delivery.AckEmit] appends: the stream key and the
// entry's fields (not the reserved branded-id field `id`).
type Emit struct {
	Stream string
	Fields map[string][]byte
}

// EmittedEntry is one entry an AckEmit appended.
type EmittedEntry struct {
	// ID is its new branded id (28 lowercase hex characters).
	ID string
	// StreamID is its id in Stream, `<ms>-<seq>`.
	StreamID string
	// Stream is the stream key it was appended to.
	Stream string
}

// AckEmitError is an AckEmit the sidecar refused: nothing was written and
// nothing acknowledged by it. The same [VerdictError] also reaches
// [ConsumerConfig.OnVerdictError].
//
// When [AckEmitError.Held] (a bad emit: [CodeInvalidArgument],
// [CodePermissionDenied]) the call still holds the delivery and it is
// unsettled again: a handler that returns the error fails it with that
// reason (it comes back, counting an attempt), or it may answer it again.
// Otherwise ([CodeNotPending], [CodeUnknownID]: acknowledged already, say by
// a duplicate run; [CodeLeaseLost]: a peer has it; [CodeUnavailable]) the
// delivery is settled here and no verdict follows it.
type AckEmitError struct {
	VerdictError
}

// Held reports whether the call still holds the delivery (a bad emit): it
// may be answered again.
func (e *AckEmitError) Held() bool {
	return e.Code == CodeInvalidArgument || e.Code == CodePermissionDenied
}

func (e *AckEmitError) Error() string {
	return fmt.Sprintf("echomq: AckEmit of %s not applied (%s): %s", e.ID, CodeName(e.Code), e.Message)
}

// ErrAckEmitUnanswered is returned (wrapping [ErrCallEnded]) by
// [Delivery.AckEmit] when the call ended after the AckEmit was sent and
// before its answer came: the step may have been applied (the entry is then
// acknowledged and its emits written) or not (the entry comes back). Either
// way the emits are written once.
var ErrAckEmitUnanswered = fmt.Errorf("%w before the AckEmit was answered: it may or may not have been applied; its emits are written once either way", ErrCallEnded)

// emitAnswer is the sidecar's answer to one AckEmit: emitted, or refused.
type emitAnswer struct {
	emitted *pb.Emitted
	refused *VerdictError
}

// AckEmit acknowledges the delivery and appends emits, in one step the
// sidecar applies only while this consumer still holds the entry: its emits
// are written exactly once, together with its acknowledgement, whatever
// redeliveries, reclaims by peers and duplicate handler runs happened. No
// emits: an ack that applies only while the entry is held.
//
// The AckEmit goes out at once as its own message (never coalesced with
// acks); AckEmit then waits for the sidecar's answer (at most until the call
// ends) and returns the emitted entries, in the order of emits.
//
// Errors: *[AckEmitError] when the sidecar refused it (nothing written; see
// [AckEmitError.Held] for what became of the delivery);
// [ErrAckEmitUnanswered] when the call ended before the answer;
// [ErrAlreadySettled], [ErrLeaseLost] or [ErrCallEnded] when nothing was
// sent, as for [Delivery.Ack].
func (d *Delivery) AckEmit(emits ...Emit) ([]EmittedEntry, error) {
	wire := make([]*pb.Emit, len(emits))
	for i, e := range emits {
		wire[i] = &pb.Emit{Stream: e.Stream, Fields: e.Fields}
	}
	if err := d.settle(ackEmitted); err != nil {
		return nil, err
	}
	req := &pb.ConsumeRequest{Kind: &pb.ConsumeRequest_AckEmit{AckEmit: &pb.AckEmit{Id: d.ID, Emits: wire}}}
	answer, err := d.call.ackEmit(req)
	if err != nil {
		return nil, err
	}
	if answer.refused != nil {
		refused := &AckEmitError{*answer.refused}
		if refused.Held() && d.settled.CompareAndSwap(int32(ackEmitted), int32(unsettled)) {
			d.call.reheld()
		}
		return nil, refused
	}
	entries := answer.emitted.GetEntries()
	out := make([]EmittedEntry, len(entries))
	for i, e := range entries {
		out[i] = EmittedEntry{ID: e.GetId(), StreamID: e.GetStreamId(), Stream: e.GetStream()}
	}
	return out, nil
}

// ackEmit sends req (an AckEmit) and waits for its answer, or for the end of
// the call ([ErrAckEmitUnanswered]).
func (k *call) ackEmit(req *pb.ConsumeRequest) (emitAnswer, error) {
	id := req.GetAckEmit().GetId()
	answer := make(chan emitAnswer, 1)
	k.emitMu.Lock()
	if k.emits == nil {
		k.emits = map[string]chan emitAnswer{}
	}
	if _, twice := k.emits[id]; twice {
		k.emitMu.Unlock()
		return emitAnswer{}, ErrAlreadySettled
	}
	k.emits[id] = answer
	k.emitMu.Unlock()
	if err := k.send(req); err != nil {
		k.takeEmit(id)
		return emitAnswer{}, err
	}
	select {
	case a := <-answer:
		return a, nil
	case <-k.recvDone:
		select {
		case a := <-answer: // answered just before the call ended
			return a, nil
		default:
			k.takeEmit(id)
			return emitAnswer{}, ErrAckEmitUnanswered
		}
	}
}

// answerEmit hands a to the AckEmit of id waiting for it; false if none waits.
func (k *call) answerEmit(id string, a emitAnswer) bool {
	if ch := k.takeEmit(id); ch != nil {
		ch <- a
		return true
	}
	return false
}

func (k *call) takeEmit(id string) chan emitAnswer {
	k.emitMu.Lock()
	defer k.emitMu.Unlock()
	ch := k.emits[id]
	delete(k.emits, id)
	return ch
}

// reheld counts a delivery the call holds again: its AckEmit was refused
// for a bad emit, so the sidecar still holds it for the call.
func (k *call) reheld() { k.held.Add(1) }
