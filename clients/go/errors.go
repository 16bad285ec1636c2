package echomq

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/echomq/echomq-sidecar/clients/go/echomqv1"
)

var (
	// ErrInvalidConfig wraps every problem [Consumer.Run] finds in a
	// [ConsumerConfig] before it contacts the sidecar.
	ErrInvalidConfig = errors.New("echomq: invalid consumer config")
	// ErrAlreadySettled is returned by a second Ack, Fail or DeadLetter of the
	// same [Delivery]: the first verdict stands.
	ErrAlreadySettled = errors.New("echomq: delivery already settled")
	// ErrCallEnded is returned when a verdict is for a Consume call that has
	// ended (broken, reconnected, or stopped). Nothing is sent: the entry stays
	// pending and the sidecar delivers it again, so a verdict can never reach a
	// call that does not hold the delivery.
	// It is also the cause ([context.Cause]) of the handler contexts of a
	// call that ended.
	ErrCallEnded = errors.New("echomq: the consume call of this delivery has ended; its entry will be delivered again")
	// ErrNotRunning is returned by [Consumer.Send] once Run has returned.
	ErrNotRunning = errors.New("echomq: consumer is not running")
	// ErrRunTwice is returned by a second [Consumer.Run]: a Consumer runs once.
	ErrRunTwice = errors.New("echomq: Consumer.Run called more than once")
	// ErrLeaseLost is the cause ([context.Cause]) of a handler context
	// cancelled because the sidecar reported the delivery's lease lost
	// ([CodeLeaseLost]): a peer reclaimed the entry and may be running it now.
	// Ack, Fail, DeadLetter and Extend of that delivery return it and send
	// nothing, and the handler's return value is not sent either: the entry
	// belongs to the peer, and a verdict would only be answered NOT_PENDING.
	ErrLeaseLost = errors.New("echomq: the delivery's lease was lost: a peer reclaimed the entry; no verdict is sent for it")
)

// SubscriptionError is a permanent failure of the Consume call: the sidecar
// refused the subscription with a code that retrying cannot fix (see
// [IsPermanent]). [Consumer.Run] returns it at once and does not reconnect.
// It carries the gRPC status, so [status.Code] works on it.
type SubscriptionError struct {
	// Stream and Group are the subscription that was refused.
	Stream, Group string
	// Status is the sidecar's answer; its message says what to fix.
	Status *status.Status
}

func (e *SubscriptionError) Error() string {
	return fmt.Sprintf("echomq: subscription to stream %q group %q refused (%s, not retried): %s",
		e.Stream, e.Group, e.Status.Code(), e.Status.Message())
}

// GRPCStatus lets [status.FromError] and [status.Code] see the sidecar's status.
func (e *SubscriptionError) GRPCStatus() *status.Status { return e.Status }

// Code is the gRPC status code, such as codes.InvalidArgument.
func (e *SubscriptionError) Code() codes.Code { return e.Status.Code() }

// IsPermanent reports whether a Consume call that ended with code should not be
// retried: the request itself is wrong (INVALID_ARGUMENT, OUT_OF_RANGE), the
// caller may not make it (PERMISSION_DENIED, UNAUTHENTICATED), the data is in a
// state retrying cannot change (FAILED_PRECONDITION, e.g. the stream key holds
// another Redis type; ALREADY_EXISTS, NOT_FOUND), or the server does not offer
// the call (UNIMPLEMENTED). Everything else — UNAVAILABLE above all, but also a
// call reset mid-way — is transient.
func IsPermanent(code codes.Code) bool {
	switch code {
	case codes.InvalidArgument, codes.OutOfRange, codes.PermissionDenied, codes.Unauthenticated,
		codes.FailedPrecondition, codes.AlreadyExists, codes.NotFound, codes.Unimplemented:
		return true
	}
	return false
}

// VerdictErrorCode says why the sidecar did not apply a verdict. The constants
// are the wire enum's values; String gives the short name (UNKNOWN_ID, …).
type VerdictErrorCode = pb.VerdictErrorCode

// The verdict error codes.
const (
	// CodeUnknownID: the call does not hold the id (never delivered to it,
	// already settled, or its ack deadline passed). Nothing was applied.
	CodeUnknownID = pb.VerdictErrorCode_VERDICT_ERROR_CODE_UNKNOWN_ID
	// CodeNotPending: Redis no longer has the entry pending for the group (a
	// peer reclaimed it). It may be delivered again: handle it idempotently.
	CodeNotPending = pb.VerdictErrorCode_VERDICT_ERROR_CODE_NOT_PENDING
	// CodeInvalidArgument: a malformed id or field (a negative retry delay).
	CodeInvalidArgument = pb.VerdictErrorCode_VERDICT_ERROR_CODE_INVALID_ARGUMENT
	// CodeUnavailable: Redis failed while applying it; the entry stays pending.
	CodeUnavailable = pb.VerdictErrorCode_VERDICT_ERROR_CODE_UNAVAILABLE
	// CodeLeaseLost, sent unprompted: the sidecar lost the delivery's lease and
	// a peer reclaimed the entry, which may be running elsewhere now. The
	// consumer cancels that delivery's handler context with cause
	// [ErrLeaseLost] and sends no verdict for it; if the entry comes back, it
	// is a new delivery (Attempts higher), settled as usual.
	CodeLeaseLost = pb.VerdictErrorCode_VERDICT_ERROR_CODE_LEASE_LOST
	// CodePermissionDenied: an AckEmit names a stream outside the sidecar's
	// allow-list. Nothing was written or acknowledged; the call still holds
	// the delivery ([AckEmitError.Held]).
	CodePermissionDenied = pb.VerdictErrorCode_VERDICT_ERROR_CODE_PERMISSION_DENIED
)

// VerdictError is a verdict (or extension) the sidecar did not apply. The call
// goes on; the consumer hands it to [ConsumerConfig.OnVerdictError].
type VerdictError struct {
	// ID is the branded id as the client sent it.
	ID string
	// Code is the reason as a code.
	Code VerdictErrorCode
	// Message is the reason for a person.
	Message string
}

func (e VerdictError) Error() string {
	return fmt.Sprintf("echomq: verdict for %s not applied (%s): %s", e.ID, CodeName(e.Code), e.Message)
}

// CodeName is the short name of a verdict error code: UNKNOWN_ID, NOT_PENDING,
// INVALID_ARGUMENT, UNAVAILABLE, LEASE_LOST, PERMISSION_DENIED (or the wire name of a newer code).
func CodeName(code VerdictErrorCode) string {
	return strings.TrimPrefix(code.String(), "VERDICT_ERROR_CODE_")
}
