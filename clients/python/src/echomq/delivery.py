"""What a handler receives (`Delivery`), what a batch handler answers per
delivery (`Ack`, `Fail`, `DeadLetter`), whose fault a failure was
(`FailKind`), what the sidecar reports about a verdict it did not apply
(`VerdictError`), and what consume → produce sends and answers (`Emit`,
`EmittedEntry`, `AckEmitError`)."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import NamedTuple, Protocol, Union

from .errors import EchoMQError, PoisonError, TransientError
from ._fields import Fields, encode_fields
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
    #: The consumer sets the delivery's `lease_lost` event and sends no
    #: verdict for it afterwards.
    LEASE_LOST = pb.VERDICT_ERROR_CODE_LEASE_LOST
    #: An `ack_emit` names a stream outside the sidecar's allow-list. Nothing
    #: was written or acknowledged; the call still holds the delivery.
    PERMISSION_DENIED = pb.VERDICT_ERROR_CODE_PERMISSION_DENIED

    @classmethod
    def of(cls, value: int) -> VerdictErrorCode:
        try:
            return cls(value)
        except ValueError:  # a code added to the proto after this client was built
            return cls.UNSPECIFIED


class FailKind(enum.Enum):
    """Whose fault a failure was; mirrors `echomq.v1.FailKind`, and decides
    whether the failure counts as an attempt (clients/CONTRACT.md, "Failure kinds")."""

    #: The entry's: its next delivery counts as another attempt, toward
    #: `max_deliveries`. What a fail is unless it says otherwise.
    MESSAGE = pb.FAIL_KIND_MESSAGE
    #: Not the entry's (its database is down, a rate limit): delivered again
    #: after the delay with the `attempts` it had, never dead-lettered for it.
    TRANSIENT = pb.FAIL_KIND_TRANSIENT
    #: It can never succeed: dead-lettered now.
    POISON = pb.FAIL_KIND_POISON


def fail_kind_of(error: BaseException) -> FailKind:
    """The kind of failure a handler's exception means: TRANSIENT for a
    `TransientError`, POISON for a `PoisonError`, MESSAGE for anything else."""
    if isinstance(error, TransientError):
        return FailKind.TRANSIENT
    if isinstance(error, PoisonError):
        return FailKind.POISON
    return FailKind.MESSAGE


def fail_request(
    id: str, reason: str, retry_after: Seconds | None, kind: FailKind, *, dead_letter: bool = False
) -> pb.ConsumeRequest:
    """The one place a Fail is built: every fail, raised or explicit, carries
    its kind on the wire."""
    if not isinstance(kind, FailKind):
        raise TypeError(f"kind must be a FailKind, not {kind!r}")
    fail = pb.Fail(id=id, reason=reason, dead_letter=dead_letter, kind=kind.value)
    if retry_after is not None:
        fail.retry_after.CopyFrom(to_duration(retry_after))
    return pb.ConsumeRequest(fail=fail)


@dataclass(frozen=True)
class VerdictError:
    """A verdict (or extension) the sidecar answered with an error. The call goes on."""

    id: str
    code: VerdictErrorCode
    message: str

    @classmethod
    def from_proto(cls, message: pb.VerdictError) -> VerdictError:
        return cls(id=message.id, code=VerdictErrorCode.of(message.code), message=message.message)


class Emit(NamedTuple):
    """One entry `Delivery.ack_emit` appends: its stream key and fields
    (bytes, or text sent as UTF-8; not the reserved branded-id field `id`)."""

    stream: str
    fields: Fields


class EmittedEntry(NamedTuple):
    """One entry an `ack_emit` appended: its new branded id, its id in
    `stream` (`<ms>-<seq>`) and the stream key."""

    id: str
    stream_id: str
    stream: str


#: The codes after which the call still holds the delivery: a bad emit, refused
#: before anything reached Redis. It may be answered again.
_STILL_HELD = frozenset({VerdictErrorCode.INVALID_ARGUMENT, VerdictErrorCode.PERMISSION_DENIED})


class AckEmitError(EchoMQError):
    """`Delivery.ack_emit` was not applied: nothing was written and nothing
    acknowledged by it.

    `code` is the sidecar's `VerdictErrorCode`, or None when the call ended
    before the answer came (the outcome is then unknown: the step may have
    run, in which case the entry is acknowledged and its emits written, or
    not, in which case the entry comes back; either way the emits are
    written once). `held` is True when the delivery is still this
    consumer's (a bad emit: `INVALID_ARGUMENT`, `PERMISSION_DENIED`): it may
    be answered again, and a handler that lets this error propagate fails it
    with the message, as any exception does. Otherwise (`NOT_PENDING`,
    `UNKNOWN_ID`, `LEASE_LOST`: acknowledged already or a peer's now;
    `UNAVAILABLE`; the call ended) the delivery is settled here and no
    verdict follows it.
    """

    def __init__(self, id: str, code: VerdictErrorCode | None, message: str) -> None:
        self.id = id
        self.code = code
        self.message = message
        name = code.name if code is not None else "CALL_ENDED"
        super().__init__(f"ack_emit of {id}: {name}: {message}")

    @property
    def held(self) -> bool:
        """True when the delivery is still held and may be answered again."""
        return self.code in _STILL_HELD


def ack_emit_request(id: str, emits: Iterable[Emit | tuple[str, Fields]]) -> pb.ConsumeRequest:
    """The AckEmit of `id` with `emits` (each an `Emit` or a (stream, fields) pair)."""
    wire = []
    for emit in emits:
        stream, fields = emit
        if not isinstance(stream, str):
            raise TypeError(f"an emit's stream is text, got {type(stream).__name__}")
        wire.append(pb.Emit(stream=stream, fields=encode_fields(fields)))
    return pb.ConsumeRequest(ack_emit=pb.AckEmit(id=id, emits=wire))


@dataclass(frozen=True)
class Ack:
    """A batch handler's verdict: acknowledge the delivery (as `None` does)."""


@dataclass(frozen=True)
class Fail:
    """A batch handler's verdict: fail the delivery, as `Delivery.fail` does
    (`retry_after` in seconds or a timedelta; None: the subscription's backoff;
    `kind`: whose fault it was, `FailKind.MESSAGE` unless said)."""

    reason: str = ""
    retry_after: Seconds | None = None
    kind: FailKind = FailKind.MESSAGE


@dataclass(frozen=True)
class DeadLetter:
    """A batch handler's verdict: dead-letter the delivery now, as `Delivery.dead_letter` does."""

    reason: str = ""


#: One entry of a batch handler's answer: `None` or `Ack()` acks, `Fail(...)`
#: fails, `DeadLetter(...)` dead-letters, an exception instance fails with its
#: message and the kind its type says (as raising does in a per-delivery
#: handler: `TransientError` is TRANSIENT, `PoisonError` POISON).
Verdict = Union[Ack, Fail, DeadLetter, Exception, None]


class Outbox(Protocol):
    """The Consume call a delivery arrived on, as far as a delivery sees it."""

    #: False once the call is closed: its deliveries can no longer be settled.
    open: bool

    def send(self, request: pb.ConsumeRequest) -> bool:
        """Queues a message on this call (after any coalesced acks); False when
        the call has ended."""
        ...

    def ack(self, delivery: Delivery) -> bool:
        """The delivery is acked: the call stops tracking it and queues its id
        for the next (coalesced) Ack message; False when the call has ended."""
        ...

    def release(self, delivery: Delivery) -> None:
        """The delivery is settled (or lost): the call stops tracking it."""
        ...

    def ack_emit(
        self, request: pb.ConsumeRequest, delivery: Delivery
    ) -> asyncio.Future[pb.Emitted | VerdictError | None] | None:
        """Sends the AckEmit of `delivery` (never coalesced) and returns the
        future of its answer (None: the call ended first); None when the call
        has ended."""
        ...


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def payload_dict(fields: Mapping[str, bytes]) -> dict[str, bytes]:
    """A wire `map<string, bytes>` as a dict. Not `dict(fields)`: on a
    protobuf map that goes through the `Mapping` mixin's Python-level
    `keys()`, and costs ~1.8x as much (upb, 2 fields: 3.5 µs against 1.9)."""
    return {name: fields[name] for name in fields}


class Delivery:
    """One hand-over of a stream entry to this consumer.

    Attributes: `id` (the branded id, 28 lowercase hex characters: the
    idempotency key, ordered like the stream), `stream_id` (`<ms>-<seq>` in
    this stream), `stream`, `group`, `payload` (field name → bytes, without the
    reserved branded-id field), `raw_fields` (fields whose names are not
    UTF-8), `attempts` (1 on the first delivery), `minted_at` (UTC datetime),
    `traceparent` (W3C trace context or "").

    Acks are coalesced: `ack()` queues the id and the consumer sends one `Ack`
    message per short window (`Consumer(ack_linger=...)`, 1 ms by default, or
    as soon as 256 ids, at most a quarter of `max_in_flight`, are queued, or
    as soon as every delivery handed out has been handled). A fail or dead-letter goes out
    at once, after the acks queued before it.

    Returning from the handler acks the delivery; raising fails it with the
    exception's message. A handler may instead settle it explicitly with
    `ack()`, `fail()`, `dead_letter()` or `ack_emit()` (acknowledge and
    append what it produced, exactly once); the first settlement wins and the
    consumer does not settle it again.

    A delivery belongs to the call it arrived on. If that call broke (the
    consumer has reconnected since), the sidecar has already returned the entry
    to the group and will deliver it again, so settling it is impossible: the
    methods then send nothing and return False.

    Lease lost: when the sidecar reports `LEASE_LOST` for this delivery (a peer
    reclaimed the entry while it was held here), `lease_lost` (an
    `asyncio.Event`) is set. The handler is not cancelled (cancelling user code
    mid-write loses work): a long handler should check or await it and give
    up. From then on the delivery is no longer this consumer's: `ack()`,
    `fail()`, `dead_letter()` and `extend()` send nothing and return False,
    and the consumer sends no verdict for it whatever the handler returns. If
    the entry comes back to this consumer, it is a new `Delivery` (with
    higher `attempts`).
    """

    # The hot path builds a delivery from its wire message and converts each
    # attribute only when something reads it (most handlers read a few, and a
    # payload dict costs more than the rest of the delivery): `_message` is
    # the `pb.Delivery` (one built from the arguments, for a delivery built by
    # keyword), which the plain attributes read; the `_`-named slots keep what
    # was converted. A delivery so keeps its frame's decoded message alive
    # while it lives: at most `max_batch` entries per frame.
    __slots__ = (
        "id",
        "_message",
        "_payload",
        "_raw_fields",
        "_minted_at",
        "_call",
        "_settled",
        "_lost",
        "_lost_event",
        "_lost_hooks",
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
        self._message = pb.Delivery(
            id=id, stream_id=stream_id, stream=stream, group=group, attempts=attempts, traceparent=traceparent
        )
        self._payload: dict[str, bytes] | None = payload
        self._raw_fields: list[RawField] | None = raw_fields
        self._minted_at: datetime | None = minted_at
        self._call = call
        self._settled = False
        self._lost = False
        self._lost_event: asyncio.Event | None = None
        self._lost_hooks: list[Callable[[], object]] | None = None

    @classmethod
    def from_proto(cls, message: pb.Delivery, call: Outbox) -> Delivery:
        """The delivery of one message (see `_from_frame`, the hot path's)."""
        return cls._from_frame((message,), call)[0]

    @classmethod
    def _from_frame(cls, messages: Iterable[pb.Delivery], call: Outbox) -> list[Delivery]:
        """`from_proto` of each message of a frame, in order: the consumer's
        hot path, one loop with its names local rather than a call per
        delivery (~0.05 µs a delivery less)."""
        new = cls.__new__
        deliveries: list[Delivery] = []
        append = deliveries.append
        for message in messages:
            # Slots filled directly, only the id read now; the rest when a
            # handler reads it.
            self = new(cls)
            self.id = message.id
            self._message = message
            self._payload = None
            self._raw_fields = None
            self._minted_at = None
            self._call = call
            self._settled = False
            self._lost = False
            self._lost_event = None  # created when someone asks: most deliveries never need one
            self._lost_hooks = None
            append(self)
        return deliveries

    @property
    def stream_id(self) -> str:
        """The entry's id in this stream (`<ms>-<seq>`)."""
        return self._message.stream_id

    @property
    def stream(self) -> str:
        """The stream the entry was read from."""
        return self._message.stream

    @property
    def group(self) -> str:
        """The consumer group it was delivered through."""
        return self._message.group

    @property
    def payload(self) -> dict[str, bytes]:
        """Field name → bytes, without the reserved branded-id field (a dict
        of this delivery's own: changing it changes nothing else)."""
        if self._payload is None:
            self._payload = payload_dict(self._message.payload)
        return self._payload

    @property
    def raw_fields(self) -> list[RawField]:
        """The fields whose names are not valid UTF-8 (so not `payload` keys)."""
        if self._raw_fields is None:
            self._raw_fields = [RawField(f.name, f.value) for f in self._message.raw_fields]
        return self._raw_fields

    @property
    def attempts(self) -> int:
        """The entry's delivery count in the group: 1 on the first delivery."""
        return self._message.attempts

    @property
    def minted_at(self) -> datetime:
        """When the branded id was minted (UTC; millisecond precision)."""
        if self._minted_at is None:
            minted = self._message.minted_at
            self._minted_at = _EPOCH + timedelta(seconds=minted.seconds, microseconds=minted.nanos // 1000)
        return self._minted_at

    @property
    def traceparent(self) -> str:
        """The W3C trace context the entry carries, or ""."""
        return self._message.traceparent

    @property
    def settled(self) -> bool:
        """True once an ack, fail, dead-letter or ack_emit has been issued for
        this delivery (an ack_emit refused for a bad emit unsettles it again)."""
        return self._settled

    @property
    def lease_lost(self) -> asyncio.Event:
        """Set when the sidecar reported LEASE_LOST for this delivery: a peer
        reclaimed the entry, which may be running elsewhere now. Await it
        (`await delivery.lease_lost.wait()`) or poll `is_set()` in a long
        handler and stop working on the entry; no verdict is sent for it."""
        if self._lost_event is None:
            self._lost_event = asyncio.Event()
            if self._lost:
                self._lost_event.set()
        return self._lost_event

    def _lose(self) -> None:
        """The sidecar said LEASE_LOST: no verdict from now on; signal the handler."""
        if self._lost:
            return
        self._lost = True
        if self._lost_event is not None:
            self._lost_event.set()
        for hook in self._lost_hooks or ():
            try:
                hook()
            except Exception:
                log.exception("a lease-lost hook raised")

    def _on_lease_lost(self, hook: Callable[[], object]) -> None:
        """Calls `hook` (on the consumer's loop) when the lease is lost, or now
        if it already was (how `echomq.sync` sets its `threading.Event`)."""
        if self._lost:
            hook()
            return
        if self._lost_hooks is None:
            self._lost_hooks = []
        self._lost_hooks.append(hook)

    def _closed(self, what: str) -> bool:
        """True (and logged) when no verdict may be sent: already settled, or the lease lost."""
        if self._lost:
            log.debug("the lease of %s was lost; %s not sent (the entry is a peer's now)", self.id, what)
            return True
        if self._settled:
            log.debug("delivery %s is already settled; %s ignored", self.id, what)
            return True
        return False

    async def ack(self) -> bool:
        """Acknowledges the delivery (XACK): it leaves the group's PEL for good.
        The id travels in the call's next coalesced Ack message. False (and
        nothing sent) when already settled, when the lease was lost, or when
        the call it arrived on has ended."""
        return self._ack()

    def _ack(self) -> bool:
        """`ack()` without the coroutine, for the consumer's own settling
        (after every handler that returns: no coroutine object per delivery)."""
        if self._settled or self._lost:  # rare: tested inline, `_closed` logs why
            self._closed("ack")
            return False
        self._settled = True
        if not self._call.ack(self):
            self._dropped("ack")
            return False
        return True

    async def ack_emit(self, emits: Iterable[Emit | tuple[str, Fields]]) -> list[EmittedEntry]:
        """Acknowledges the delivery and appends `emits` (each an `Emit`, or a
        `(stream, fields)` pair), in one step the sidecar applies only while
        this consumer still holds the entry: the emits of an entry are
        written exactly once, together with its acknowledgement, whatever
        redeliveries, reclaims and duplicate handler runs happened. No emits:
        an ack that applies only while the entry is held.

        Sent at once as its own message (never coalesced with acks), then
        waits for the sidecar's answer. Returns the emitted entries, in the
        order of `emits`.

        Raises `AckEmitError` when it was not applied (nothing written): see
        its `code` and `held`. With `held` (a bad emit) the delivery is still
        unsettled: let the error propagate and the consumer fails it with the
        error's message (it comes back, counting an attempt), or answer it
        again. Otherwise it is settled. Raises `AckEmitError` (code None,
        nothing sent) when the delivery is already settled, its lease was
        lost, or its call has ended. Raises `TypeError` for an emit that is
        not a stream name and fields.
        """
        request = ack_emit_request(self.id, emits)
        if self._closed("ack_emit"):
            why = "the lease was lost" if self._lost else "the delivery is already settled"
            raise AckEmitError(self.id, None, f"not sent: {why}")
        self._settled = True
        answer = self._call.ack_emit(request, self)
        if answer is None:
            self._call.release(self)
            self._dropped("ack_emit")
            raise AckEmitError(self.id, None, "not sent: the call it arrived on has ended")
        try:
            result = await answer
        except BaseException:
            self._call.release(self)
            raise
        if isinstance(result, pb.Emitted):
            self._call.release(self)
            return [EmittedEntry(e.id, e.stream_id, e.stream) for e in result.entries]
        if result is None:
            self._call.release(self)
            raise AckEmitError(
                self.id,
                None,
                "the call ended before the answer: the step may have been applied "
                "(the entry acknowledged, its emits written once) or not (the entry comes back)",
            )
        error = AckEmitError(self.id, result.code, result.message)
        if error.held and not self._lost:
            self._settled = False  # still held: it may be answered again
        else:
            self._call.release(self)
        raise error

    async def fail(
        self, reason: str = "", *, retry_after: Seconds | None = None, kind: FailKind = FailKind.MESSAGE
    ) -> bool:
        """Fails the delivery: it stays pending and comes back after
        `retry_after` (seconds or timedelta), or after the subscription's
        exponential backoff when None. `reason` (at most 4096 bytes are kept)
        shows in logs and in a later dead-letter entry. `kind` says whose
        fault it was: `FailKind.MESSAGE` counts as an attempt,
        `FailKind.TRANSIENT` does not (the database is down: fail transient),
        `FailKind.POISON` dead-letters now."""
        return self._settle(fail_request(self.id, reason, retry_after, kind), "fail")

    async def dead_letter(self, reason: str = "") -> bool:
        """Moves the entry to the dead-letter stream now (with its branded id,
        source stream, group, attempts and `reason`) instead of retrying it:
        a fail of kind POISON, sent with `dead_letter` too so that a sidecar
        older than `FailKind` does the same."""
        request = fail_request(self.id, reason, None, FailKind.POISON, dead_letter=True)
        return self._settle(request, "dead-letter")

    async def extend(self, by: Seconds) -> bool:
        """Pushes the ack deadline back to `by` from now (only meaningful with
        the consumer's `ack_deadline`). Does not settle the delivery."""
        if self._settled or self._lost:
            return False
        request = pb.ConsumeRequest(extend=pb.Extend(ids=[self.id], by=to_duration(by)))
        return self._call.send(request)

    def _settle(self, request: pb.ConsumeRequest, what: str) -> bool:
        if self._closed(what):
            return False
        self._settled = True
        self._call.release(self)
        if not self._call.send(request):
            self._dropped(what)
            return False
        return True

    def _dropped(self, what: str) -> None:
        log.info(
            "%s of %s dropped: the call it arrived on has ended, the sidecar will deliver it again", what, self.id
        )

    def __repr__(self) -> str:
        return (
            f"Delivery(id={self.id!r}, stream_id={self.stream_id!r}, stream={self.stream!r}, "
            f"group={self.group!r}, attempts={self.attempts}, fields={sorted(self.payload)!r})"
        )
