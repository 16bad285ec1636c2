"""The client's exceptions, and the one place that maps a gRPC status to them."""

from __future__ import annotations

import grpc

#: Status codes that no retry can fix: the request or the setup is wrong. The
#: consumer raises these instead of reconnecting, and every call of this
#: package raises them as `PermanentError`. The same set in all four clients
#: (clients/CONTRACT.md); every other code (UNAVAILABLE above all,
#: DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, INTERNAL, UNKNOWN) is
#: transient: the consumer reconnects with its backoff.
PERMANENT_CODES: frozenset[grpc.StatusCode] = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


class EchoMQError(Exception):
    """Base class of every error this package raises."""


class RpcError(EchoMQError):
    """A call to the sidecar ended with a non-OK gRPC status.

    `code` is the `grpc.StatusCode`, `details` the sidecar's message (it says
    what to fix), `operation` what the client was doing.
    """

    def __init__(self, operation: str, code: grpc.StatusCode, details: str) -> None:
        self.operation = operation
        self.code = code
        self.details = details
        super().__init__(f"{operation}: {code.name}: {details}")

    @property
    def permanent(self) -> bool:
        """True when retrying the same request cannot succeed."""
        return self.code in PERMANENT_CODES


class PermanentError(RpcError):
    """An `RpcError` with a code in `PERMANENT_CODES`: fix the request or the setup."""


class NotScheduledError(PermanentError):
    """`Streams.cancel_scheduled` found no such entry scheduled on that stream
    key (code NOT_FOUND): it entered the stream already (and is delivered
    there), was cancelled, or was never scheduled there."""


class TransientError(EchoMQError):
    """Raised by a handler that could not try the delivery (its database is
    down, a rate limit): the consumer fails it with kind TRANSIENT and the
    message as the reason. It comes back after the backoff with the
    `attempts` it had, so it is never dead-lettered for this (clients/CONTRACT.md,
    "Failure kinds"). Chain the cause: `raise TransientError("db down") from error`.
    """


class PoisonError(EchoMQError):
    """Raised by a handler for a delivery that can never succeed (it cannot
    be parsed, it breaks a rule): the consumer fails it with kind POISON and
    the message as the reason, and the sidecar moves it to the dead-letter
    stream now, whatever `max_deliveries` would allow."""


def from_rpc_error(operation: str, error: grpc.RpcError) -> RpcError:
    """Maps a grpc error (sync or asyncio) to `RpcError` or `PermanentError`."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else None) or str(error)
    if not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.UNKNOWN
    cls = PermanentError if code in PERMANENT_CODES else RpcError
    return cls(operation, code, details)
