"""What a handler receives (`Delivery`) and what the sidecar reports about a
verdict it did not apply (`VerdictError`)."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import NamedTuple, Protocol

from .options import Seconds, to_duration
from .v1 import consumer_service_pb2 as pb

log = logging.getLogger("echomq")


class RawField(NamedTuple):
    """A field whose name is not valid UTF-8 (so it cannot be a `payload` key)."""

    name: bytes
    value: bytes


class VerdictErrorCode(enum.Enum):
    """Why the sidecar did not apply a verdict; mirrors `echomq.v1.VerdictErrorCode`."""

    UNSPECIFIED = pb.VERDICT_ERROR_CODE_UNSPECIFIED
    #: The call does not hold the id: never delivered to it, already settled,
    #: or returned to the PEL after its ack deadline. Nothing was applied.
    UNKNOWN_ID = pb.VERDICT_ERROR_CODE_UNKNOWN_ID
    #: Redis no longer has the entry pending for the group (a peer reclaimed it,
    #: or the group was re-created). It may be delivered again.
    NOT_PENDING = pb.VERDICT_ERROR_CODE_NOT_PENDING
    #: The id or another field of the verdict is malformed. Nothing was applied.
    INVALID_ARGUMENT = pb.VERDICT_ERROR_CODE_INVALID_ARGUMENT
    #: Redis failed while applying the verdict; the entry stays pending.
    UNAVAILABLE = pb.VERDICT_ERROR_CODE_UNAVAILABLE
    #: Sent unprompted: the sidecar lost this delivery's lease and a peer
    #: reclaimed the entry; a later verdict for it is answered NOT_PENDING.
    LEASE_LOST = pb.VERDICT_ERROR_CODE_LEASE_LOST

    @classmethod
    def of(cls, value: int) -> VerdictErrorCode:
        try:
            return cls(value)
        except ValueError:  # a code added to the proto after this client was built
            return cls.UNSPECIFIED


@dataclass(frozen=True)
class VerdictError:
    """A verdict (or extension) the sidecar answered with an error. The call goes on."""

    id: str
    code: VerdictErrorCode
    message: str

    @classmethod
    def from_proto(cls, message: pb.VerdictError) -> VerdictError:
        return cls(id=message.id, code=VerdictErrorCode.of(message.code), message=message.message)


class Outbox(Protocol):
    """The Consume call a delivery arrived on, as far as a delivery sees it."""

    def send(self, request: pb.ConsumeRequest) -> bool:
        """Queues a message on this call; False when the call has ended."""
        ...


class Delivery:
    """One hand-over of a stream entry to this consumer.

    Attributes: `id` (the branded id, 28 lowercase hex characters: the
    idempotency key, ordered like the stream), `stream_id` (`<ms>-<seq>` in
    this stream), `stream`, `group`, `payload` (field name → bytes, without the
    reserved branded-id field), `raw_fields` (fields whose names are not
    UTF-8), `attempts` (1 on the first delivery), `minted_at` (UTC datetime),
    `traceparent` (W3C trace context or "").

    Returning from the handler acks the delivery; raising fails it with the
    exception's message. A handler may instead settle it explicitly with
    `ack()`, `fail()` or `dead_letter()`; the first settlement wins and the
    consumer does not settle it again.

    A delivery belongs to the call it arrived on. If that call broke (the
    consumer has reconnected since), the sidecar has already returned the entry
    to the group and will deliver it again, so settling it is impossible: the
    methods then send nothing and return False.
    """

    __slots__ = (
        "id",
        "stream_id",
        "stream",
        "group",
        "payload",
        "raw_fields",
        "attempts",
        "minted_at",
        "traceparent",
        "_call",
        "_settled",
    )

    def __init__(
        self,
        *,
        id: str,
        stream_id: str,
        stream: str,
        group: str,
        payload: dict[str, bytes],
        raw_fields: list[RawField],
        attempts: int,
        minted_at: datetime,
        traceparent: str,
        call: Outbox,
    ) -> None:
        self.id = id
        self.stream_id = stream_id
        self.stream = stream
        self.group = group
        self.payload = payload
        self.raw_fields = raw_fields
        self.attempts = attempts
        self.minted_at = minted_at
        self.traceparent = traceparent
        self._call = call
        self._settled = False

    @classmethod
    def from_proto(cls, message: pb.Delivery, call: Outbox) -> Delivery:
        return cls(
            id=message.id,
            stream_id=message.stream_id,
            stream=message.stream,
            group=message.group,
            payload=dict(message.payload),
            raw_fields=[RawField(f.name, f.value) for f in message.raw_fields],
            attempts=message.attempts,
            minted_at=message.minted_at.ToDatetime(tzinfo=timezone.utc),
            traceparent=message.traceparent,
            call=call,
        )

    @property
    def settled(self) -> bool:
        """True once an ack, fail or dead-letter has been issued for this delivery."""
        return self._settled

    async def ack(self) -> bool:
        """Acknowledges the delivery (XACK): it leaves the group's PEL for good."""
        return self._settle(pb.ConsumeRequest(ack=pb.Ack(ids=[self.id])), "ack")

    async def fail(self, reason: str = "", *, retry_after: Seconds | None = None) -> bool:
        """Fails the delivery: it stays pending and comes back after
        `retry_after` (seconds or timedelta), or after the subscription's
        exponential backoff when None. `reason` (at most 4096 bytes are kept)
        shows in logs and in a later dead-letter entry."""
        fail = pb.Fail(id=self.id, reason=reason)
        if retry_after is not None:
            fail.retry_after.CopyFrom(to_duration(retry_after))
        return self._settle(pb.ConsumeRequest(fail=fail), "fail")

    async def dead_letter(self, reason: str = "") -> bool:
        """Moves the entry to the dead-letter stream now (with its branded id,
        source stream, group, attempts and `reason`) instead of retrying it."""
        request = pb.ConsumeRequest(fail=pb.Fail(id=self.id, reason=reason, dead_letter=True))
        return self._settle(request, "dead-letter")

    async def extend(self, by: Seconds) -> bool:
        """Pushes the ack deadline back to `by` from now (only meaningful with
        the consumer's `ack_deadline`). Does not settle the delivery."""
        if self._settled:
            return False
        request = pb.ConsumeRequest(extend=pb.Extend(ids=[self.id], by=to_duration(by)))
        return self._call.send(request)

    def _settle(self, request: pb.ConsumeRequest, what: str) -> bool:
        if self._settled:
            log.debug("delivery %s is already settled; %s ignored", self.id, what)
            return False
        self._settled = True
        if not self._call.send(request):
            log.info(
                "%s of %s dropped: the call it arrived on has ended, the sidecar will deliver it again",
                what,
                self.id,
            )
            return False
        return True

    def __repr__(self) -> str:
        return (
            f"Delivery(id={self.id!r}, stream_id={self.stream_id!r}, stream={self.stream!r}, "
            f"group={self.group!r}, attempts={self.attempts}, fields={sorted(self.payload)!r})"
        )
