package echomq

import (
	"errors"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

// FailKind says whose fault a failure was, which decides whether it counts as
// an attempt. The constants are the wire enum's values (clients/CONTRACT.md,
// "Failure kinds").
type FailKind = pb.FailKind

// The failure kinds.
const (
	// FailKindMessage: the entry failed. Its next delivery counts as another
	// attempt, toward [ConsumerConfig.MaxDeliveries]. What a returned error
	// and a plain [Delivery.Fail] send.
	FailKindMessage = pb.FailKind_FAIL_KIND_MESSAGE
	// FailKindTransient: the handler could not try (its database is down, a
	// rate limit). The entry comes back after the delay with the Attempts it
	// had, and is never dead-lettered for it. See [Transient].
	FailKindTransient = pb.FailKind_FAIL_KIND_TRANSIENT
	// FailKindPoison: the entry can never succeed; it is dead-lettered now.
	// See [Poison].
	FailKindPoison = pb.FailKind_FAIL_KIND_POISON
)

// Transient wraps err so that a handler returning it (or a batch handler
// answering it) fails the delivery with [FailKindTransient]: no attempt is
// spent, so the database being down never dead-letters an entry. The reason
// sent is err.Error(); errors.Is and errors.As see err through it. Transient
// of nil is nil, so `return echomq.Transient(db.Save(x))` acks on success.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &TransientError{Err: err}
}

// Poison wraps err so that a handler returning it (or a batch handler
// answering it) fails the delivery with [FailKindPoison]: it goes to the
// dead-letter stream now, whatever attempts are left. Poison of nil is nil.
func Poison(err error) error {
	if err == nil {
		return nil
	}
	return &PoisonError{Err: err}
}

// TransientError is what [Transient] returns; find it with errors.As.
type TransientError struct{ Err error }

func (e *TransientError) Error() string      { return e.Err.Error() }
func (e *TransientError) Unwrap() error      { return e.Err }
func (e *TransientError) failKind() FailKind { return FailKindTransient }

// PoisonError is what [Poison] returns; find it with errors.As.
type PoisonError struct{ Err error }

func (e *PoisonError) Error() string      { return e.Err.Error() }
func (e *PoisonError) Unwrap() error      { return e.Err }
func (e *PoisonError) failKind() FailKind { return FailKindPoison }

// kindOf is the failure kind a handler's error means: that of the outermost
// [TransientError] or [PoisonError] in its chain, else [FailKindMessage].
// Found by type (errors.As), never by the message, so a wrapped error such as
// fmt.Errorf("saving: %w", echomq.Transient(err)) keeps its kind.
func kindOf(err error) FailKind {
	var kinded interface{ failKind() FailKind }
	if errors.As(err, &kinded) {
		return kinded.failKind()
	}
	return FailKindMessage
}
