"""The asyncio consumer: one Consume call per subscription, batched delivery
frames, coalesced acks, a bounded pool of handler workers (per delivery or per
batch) or `async for` iteration, LEASE_LOST signalled to the delivery, graceful
stop, and reconnect with jittered backoff."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Union

import grpc

from . import _deprecation as deprecation
from ._channel import ChannelOptions, aio_channel
from .delivery import (
    Ack,
    DeadLetter,
    Delivery,
    Fail,
    FailKind,
    Verdict,
    VerdictError,
    VerdictErrorCode,
    fail_kind_of,
    fail_request,
)
from .errors import EchoMQError, PermanentError, from_rpc_error
from .options import Backoff, FlowControl, Seconds, Start, seconds, to_duration
from .v1 import consumer_service_pb2 as pb
from .v1 import consumer_service_pb2_grpc as pb_grpc

log = logging.getLogger("echomq")

#: A handler: returning acks the delivery, raising fails it with the message.
Handler = Callable[[Delivery], Awaitable[object]]
#: A batch handler: gets the deliveries at hand (1 to `max_batch`, in delivery
#: order) and answers one `Verdict` per delivery, in the same order (or None:
#: ack them all). Raising fails every delivery it did not settle itself.
BatchHandler = Callable[[list[Delivery]], Awaitable[Sequence[Verdict] | None]]
#: Called with each verdict error; may be a coroutine function. Keep it quick:
#: it runs on the task that reads the call.
VerdictErrorHook = Callable[[VerdictError], object]

#: The sidecar's default `--default-max-in-flight` (entries): the cap of the
#: adaptive window an unset `max_in_flight` gets (it is sent as 0; the window
#: starts at 64 and grows toward the cap while the handlers keep up), which
#: the sidecar reports in `Subscription.max_in_flight`. Used only until the
#: sidecar says. It was 64, the fixed default, before the adaptive window
#: (issue 27); the default handler concurrency is `DEFAULT_CONCURRENCY` now.
DEFAULT_MAX_IN_FLIGHT = 1024
#: Handler workers when neither `concurrency` nor `max_in_flight` is set (at
#: most the cap the sidecar reports). Not the cap: 64 workers keep up with a
#: fast handler's whole window, and when handlers are slow the deliveries
#: queue in the client, which the sidecar sees as delay and answers by
#: shrinking the window; 1024 threads would be wasted in `echomq.sync`.
DEFAULT_CONCURRENCY = 64
#: The sidecar's default `--max-in-flight-limit` (entries): the most a
#: subscribe may ask for.
MAX_IN_FLIGHT_LIMIT = 10_000
#: Default graceful-stop deadline (seconds) of `stop()` and `async with`.
DEFAULT_STOP_DEADLINE = 10.0
#: After the handlers' deadline, the least time (seconds) `stop()` still gives
#: the sidecar to take the last verdicts and end the call.
CLOSE_GRACE = 0.5
#: Most ids in one Ack message: a full window is sent at once. Also at most a
#: quarter of `max_in_flight` (clients/CONTRACT.md), see `max_ack_ids`.
MAX_ACK_BATCH = 256
#: Default `max_batch` (deliveries per frame), capped by `max_in_flight`.
DEFAULT_MAX_BATCH = 256
#: Default `ack_linger` (seconds): how long an ack waits for others to share its Ack message.
DEFAULT_ACK_LINGER = 0.001


def max_ack_ids(max_in_flight: int) -> int:
    """The most ids one coalesced Ack carries: 256, and at most a quarter of
    `max_in_flight` (at least 1), so that a small window's credit comes back
    in several steps rather than all at the end."""
    return max(1, min(MAX_ACK_BATCH, max_in_flight // 4))


@dataclass(frozen=True)
class Subscription:
    """The sidecar's confirmation of a subscription."""

    stream: str
    group: str
    #: The sidecar's consumer name in the group.
    consumer: str
    #: The effective `max_in_flight` (entries): as set, or when unset the
    #: cap of the adaptive window (`--default-max-in-flight`, 1024 by default).
    max_in_flight: int


class _Finish:
    """Queued after the last verdict: half-close the call."""


_FINISH = _Finish()


#: A worker's slot (see `Consumer._running`).
_Slot = list[Union[Delivery, list[Delivery], None]]


class _Stopping(asyncio.Event):
    """The consumer's stop flag: an `asyncio.Event` whose state is also a
    plain attribute, `up`, which a handler worker tests once per delivery
    (`is_set()` is a Python call)."""

    up = False

    def set(self) -> None:
        self.up = True
        super().set()

    def clear(self) -> None:
        self.up = False
        super().clear()


class _Ready:
    """The hand-off from the task that reads the call to the handler workers
    (or the iteration): deliveries in arrival order, and the idle workers'
    wake-ups.

    Not an `asyncio.Queue`: each put there wakes one waiting getter, so a
    frame of 256 deliveries cost 256 Futures, loop callbacks and task steps.
    Here a frame goes in at once and wakes one idle worker. A worker that
    takes a delivery and leaves others behind wakes one more, in case its
    handler suspends, and tells it which delivery it left at the head. If
    the woken worker finds that same delivery still at the head, the
    handler before it suspended at once: the handlers suspend, so it wakes
    as many workers as there are deliveries left, and they run side by side
    as with one wake-up per delivery. (Finding other deliveries proves
    nothing: the waker may have run the whole frame, and a new frame come.)
    While a woken worker has not run yet nobody else is woken. A handler
    that never suspends thus lets one worker run a whole frame in one task
    step: two wake-ups per frame. The pool stays the fixed set of
    `concurrency` workers.
    """

    def __init__(self) -> None:
        self.items: deque[Delivery] = deque()
        #: The idle workers' wake-ups; each is given the delivery its waker
        #: left at the head (None: woken by a frame, or to stop).
        self._idle: deque[asyncio.Future[Delivery | None]] = deque()
        #: Workers woken that have not run yet.
        self._waking = 0

    def put(self, deliveries: Iterable[Delivery]) -> None:
        self.items.extend(deliveries)
        if self.items and self._waking == 0:
            self._wake(1, None)

    def take(self, left: Delivery | None) -> Delivery:
        """The oldest delivery (`items` must not be empty); `left` is what
        `wait()` returned. (`Consumer._work` has it inlined: keep the two alike.)"""
        items = self.items
        delivery = items.popleft()
        if items and self._waking == 0 and self._idle:
            self._wake(len(items) if delivery is left else 1, items[0])
        return delivery

    def take_many(self, most: int, left: Delivery | None) -> list[Delivery]:
        """Up to `most` of the oldest deliveries (at least one: `items` must
        not be empty), waking others as `take` does."""
        items = self.items
        suspended = items[0] is left
        taken = [items.popleft() for _ in range(min(most, len(items)))]
        if items and self._waking == 0 and self._idle:
            self._wake(len(items) if suspended else 1, items[0])
        return taken

    async def wait(self) -> Delivery | None:
        """Waits idle until woken; returns the delivery the waker left at the
        head, for `take`."""
        future: asyncio.Future[Delivery | None] = asyncio.get_running_loop().create_future()
        self._idle.append(future)
        try:
            return await future
        finally:
            if future.done() and not future.cancelled():
                self._waking -= 1  # woken: running now (or cancelled after the wake-up)
            else:
                try:
                    self._idle.remove(future)  # cancelled while idle
                except ValueError:
                    pass

    def wake_all(self) -> None:
        """Wakes every waiter (the consumer stops: an iteration must see it)."""
        self._wake(len(self._idle), None)

    def _wake(self, count: int, head: Delivery | None) -> None:
        idle = self._idle
        while count > 0 and idle:
            future = idle.popleft()
            if not future.done():
                future.set_result(head)
                self._waking += 1
                count -= 1


class _Call:
    """One Consume call: the queue of client messages and whether it is open.

    Acks are coalesced: `ack()` adds the id to the current window, which goes
    out as one Ack message after `ack_linger` seconds or as soon as it holds
    `max_ack_ids` ids (or when the consumer finds nothing left to hand out,
    see `Consumer._flush_acks`). Any other message first flushes the window, so the
    sidecar sees verdicts in the order they were given. `finish()` flushes it
    too; `end()` (the call is over) drops it: those entries go back to the
    group with the call, and their ids are not valid on any later call.

    Deliveries keep a reference to the call they arrived on, so a verdict can
    never travel on a later call (which does not hold the id: the sidecar has
    returned the entry to the group when this call ended).
    """

    def __init__(self, ack_linger: float = DEFAULT_ACK_LINGER, max_ack_ids: int = MAX_ACK_BATCH) -> None:
        # Unbounded on purpose: it holds at most one verdict per delivery the
        # call holds (at most max_in_flight) plus raw sends, and a verdict must
        # never wait behind a full queue while its handler slot is released.
        self._outbox: asyncio.Queue[pb.ConsumeRequest | _Finish] = asyncio.Queue()
        self._ack_linger = ack_linger
        #: The most ids per Ack message; set from the effective max_in_flight
        #: when the call is subscribed (before any delivery can be acked).
        self.max_ack_ids = max_ack_ids
        self._acks: list[str] = []
        self._flush_timer: asyncio.TimerHandle | None = None
        #: Deliveries of this call that it still holds but that neither wait
        #: for a worker nor are in a handler's or the iteration's hands, by
        #: branded id: those with an AckEmit in flight, and those whose
        #: handler was cancelled by a stop. A LEASE_LOST looks here too (see
        #: `Consumer._held`); the usual delivery is never entered here.
        self.held: dict[str, Delivery] = {}
        #: AckEmits sent and not answered yet, by branded id: where an
        #: `Emitted` or a verdict error finds its waiting `ack_emit`.
        self.emits: dict[str, asyncio.Future[pb.Emitted | VerdictError | None]] = {}
        self.open = True
        self.subscribed = False
        self.drained = False

    def ack(self, delivery: Delivery) -> bool:
        """Forgets `delivery` (acked) and adds its id to the coalesced Ack
        window; False when the call is closed. (`Consumer._work` has these
        steps inlined: keep the two alike.)"""
        # `release` inlined, and one call from `Delivery._ack` rather than
        # two: every delivery whose handler returns takes this step.
        id = delivery.id
        held = self.held.pop(id, delivery)  # one lookup, not two
        if held is not delivery:
            self.held[id] = held  # a later delivery of the same id holds it, and keeps it
        if not self.open:
            return False
        self._acks.append(id)
        if len(self._acks) >= self.max_ack_ids:
            self.flush_acks()
        elif self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(self._ack_linger, self.flush_acks)
        return True

    def release(self, delivery: Delivery) -> None:
        """Forgets a settled (or lost) delivery."""
        if self.held.get(delivery.id) is delivery:
            del self.held[delivery.id]

    def ack_emit(
        self, request: pb.ConsumeRequest, delivery: Delivery
    ) -> asyncio.Future[pb.Emitted | VerdictError | None] | None:
        """Queues the AckEmit of `delivery` (after the coalesced acks, never
        among them) and returns the future its answer resolves: the
        `Emitted`, the `VerdictError`, or None when the call ends first.
        None when closed. The delivery is held (`held`) until it is
        released: a LEASE_LOST meanwhile still finds it."""
        id = request.ack_emit.id
        if not self.open or id in self.emits:
            return None
        answer: asyncio.Future[pb.Emitted | VerdictError | None] = asyncio.get_running_loop().create_future()
        self.emits[id] = answer
        self.held[id] = delivery
        self.send(request)
        return answer

    def answer_emit(self, id: str, answer: pb.Emitted | VerdictError) -> bool:
        """Resolves the waiting AckEmit of `id`; False when none waits."""
        waiting = self.emits.pop(id, None)
        if waiting is None:
            return False
        if not waiting.done():
            waiting.set_result(answer)
        return True

    def flush_acks(self) -> None:
        """Queues the coalesced acks as one Ack message now."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._acks and self.open:
            ids, self._acks = self._acks, []
            self._outbox.put_nowait(pb.ConsumeRequest(ack=pb.Ack(ids=ids)))

    def send(self, request: pb.ConsumeRequest) -> bool:
        if not self.open:
            return False
        self.flush_acks()
        self._outbox.put_nowait(request)
        return True

    def give_back(self, deliveries: list[Delivery]) -> bool:
        """Sends one `Release` of `deliveries` (of this call, never handed to a
        handler): the sidecar returns them to the group at once with their
        delivery count restored, for another consumer (this sidecar's other
        calls, or a peer's next reclaim beat), so they cost no attempt and no
        wait for the reclaim's min-idle. They count as settled here. False (and
        nothing sent) when there are none or the call is closed."""
        for delivery in deliveries:
            delivery._settled = True
            self.release(delivery)
        ids = [delivery.id for delivery in deliveries]
        return bool(ids) and self.send(pb.ConsumeRequest(release=pb.Release(ids=ids)))

    def drain(self) -> bool:
        """Asks the sidecar for no further deliveries on this call; verdicts
        still work. Sent once; false when the call is closed or already drained."""
        if self.drained:
            return False
        self.drained = self.send(pb.ConsumeRequest(drain=pb.Drain()))
        return self.drained

    def finish(self) -> None:
        """Sends the coalesced acks and what is queued, then half-closes; later
        sends are refused."""
        if self.open:
            self.flush_acks()
            self.open = False
            self._outbox.put_nowait(_FINISH)

    def end(self) -> None:
        """The call is over: coalesced acks are dropped, later sends are
        refused, and `requests()` returns (without this, gRPC's task pulling it
        would wait forever on a broken call and be destroyed pending)."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        self._acks = []
        self.held = {}
        emits, self.emits = self.emits, {}
        for waiting in emits.values():
            if not waiting.done():
                waiting.set_result(None)  # the answer is lost with the call
        if self.open:
            self.open = False
            self._outbox.put_nowait(_FINISH)

    async def requests(self, subscribe: pb.ConsumeRequest) -> AsyncIterator[pb.ConsumeRequest]:
        """The client side of the call: the subscribe, then queued messages.
        Ack messages queued back to back (the writer was slower than the
        windows) travel as one, up to `max_ack_ids` ids."""
        yield subscribe
        held: pb.ConsumeRequest | _Finish | None = None
        while True:
            item = held if held is not None else await self._outbox.get()
            held = None
            if isinstance(item, _Finish):
                return
            if item.WhichOneof("kind") == "ack":
                # Merged in place: every queued message is this call's own,
                # built for the queue, and a full window (the usual case at
                # speed) is sent as it is, not copied id by id into a new one.
                ids = item.ack.ids
                while len(ids) < self.max_ack_ids and not self._outbox.empty():
                    following = self._outbox.get_nowait()
                    if (
                        isinstance(following, pb.ConsumeRequest)
                        and following.WhichOneof("kind") == "ack"
                        and len(ids) + len(following.ack.ids) <= self.max_ack_ids
                    ):
                        ids.extend(following.ack.ids)
                    else:
                        held = following
                        break
            yield item


class Consumer:
    """Consumes a stream through a consumer group that the sidecar owns.

    ::

        async with Consumer("127.0.0.1:50051", "orders", "billing", handle,
                            start=Start.BEGINNING) as consumer:
            await consumer.wait()   # until stop() or a permanent error

    `target` is `host:port`, `unix:/path`, or a `grpc.aio.Channel` you own.
    `start` is required (see `Start`). `flow_control` (a `FlowControl`) groups
    how much the consumer takes on at once: `max_in_flight` (entries) is the
    most deliveries the sidecar hands this consumer un-settled, fixed; None
    (the default) sends 0: an adaptive window of 64 up to the sidecar's cap
    (`--default-max-in-flight`, 1024 by default), which grows while the
    handlers keep up and shrinks (down to 8) when deliveries queue in the
    client; the cap comes back in `Subscription.max_in_flight`, and the
    client never holds more than it (cap × entry size bytes). `concurrency`
    is the most handler calls running at once (a fixed pool of that many
    workers; default: `max_in_flight` when that is given, else
    `DEFAULT_CONCURRENCY` (64, at most the cap the sidecar reports); 1 for
    `batch_handler`; at most `max_in_flight` when that is given). The flat
    `max_in_flight=`, `concurrency=` and `max_batch=` keywords are the
    deprecated spelling of the same (a `DeprecationWarning`; not both).

    Give at most one of `handler` (called once per delivery: returning acks,
    raising fails) and `batch_handler` (opt-in, for bulk work: called with the
    deliveries at hand, 1 to `max_batch` of them, and answering one `Verdict`
    per delivery; see `BatchHandler`). With neither, the consumer is
    iterated instead (`async for delivery in consumer`, see `deliveries()`)
    and every delivery must be settled explicitly.

    `FlowControl.max_batch` (deliveries, default `min(256, max_in_flight)`, 256 when
    `max_in_flight` is unset, a quarter of the default cap: a frame never
    holds more than the window's free credit anyway; the sidecar
    refuses more than 4096 with INVALID_ARGUMENT) is the most deliveries per
    frame the sidecar sends, and the largest list a batch handler gets; 1 asks
    for one delivery per frame. Acks are coalesced: one `Ack` message per
    `ack_linger` window (seconds, default 0.001) or per `max_ack_ids` (256, at
    most a quarter of `max_in_flight`) ids, whichever comes first, and at
    once when every delivery handed out has been handled (no handler runs
    and none waits; the iteration asks for more and none waits); fails and
    dead letters go out at once, after the acks given before them. `ack_deadline`, `retry_backoff_initial`,
    `retry_backoff_max` (seconds or timedelta), `dead_letter_stream` and
    `max_deliveries` (poison entries go to the dead-letter stream after that
    many deliveries) are the subscription's policy; None leaves the sidecar's
    default. `no_ack=True` is the AT-MOST-ONCE mode: entries are never pending,
    so one whose handler fails, raises or never finishes is LOST (no retry, no
    dead letter); ask for it only when losing entries is acceptable.

    `key_field` and `max_in_flight_per_key` are per-key limits (ordering by
    key): `key_field` names the payload field whose value is an entry's key
    (an order's `customer`, an account), and at most `max_in_flight_per_key`
    entries (a count) of one key are held at once anywhere in the group,
    across every sidecar; a key's entries start in stream order (a failed
    entry is retried before its key's later ones; an ack or a dead letter
    frees the key). Entries without the field are not limited, and other keys
    never wait behind a busy one; 1 handles each key's entries one at a time,
    in order. A group setting, like `dead_letter_stream`: every consumer of
    the group should name the same field and limit. The sidecar checks them
    and refuses a bad combination at subscribe (a key field without a limit
    or a limit without a key field, the reserved `id` field, with `no_ack`,
    on a sharded stream: INVALID_ARGUMENT; another field or limit than the
    group's other consumers on that sidecar: FAILED_PRECONDITION), raised as
    `PermanentError` with its message. None (both): no per-key limit.

    `reconnect` is the backoff between reconnect attempts. `on_verdict_error` observes verdicts the
    sidecar did not apply (default: a warning on the `echomq` logger).
    `channel_options` and `interceptors` apply when the consumer creates the
    channel itself.

    When the call breaks (UNAVAILABLE, a refused connection, a sidecar restart)
    the consumer reconnects by itself and subscribes again with the same
    settings. A permanent status (`errors.PERMANENT_CODES`: INVALID_ARGUMENT,
    OUT_OF_RANGE, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
    UNAUTHENTICATED, FAILED_PRECONDITION, UNIMPLEMENTED) stops it: `wait()`,
    `run()`, `wait_subscribed()` and the iteration raise it as
    `PermanentError`.

    A `LEASE_LOST` verdict error (a peer reclaimed an entry this consumer
    holds) sets that delivery's `lease_lost` event and reaches
    `on_verdict_error` like every verdict error; no verdict is sent for the
    delivery afterwards, whatever its handler returns.
    """

    def __init__(
        self,
        target: str | grpc.aio.Channel,
        stream: str,
        group: str,
        handler: Handler | None = None,
        *,
        start: Start,
        flow_control: FlowControl | None = None,
        batch_handler: BatchHandler | None = None,
        ack_linger: Seconds = DEFAULT_ACK_LINGER,
        ack_deadline: Seconds | None = None,
        retry_backoff_initial: Seconds | None = None,
        retry_backoff_max: Seconds | None = None,
        dead_letter_stream: str | None = None,
        max_deliveries: int | None = None,
        no_ack: bool = False,
        key_field: str | None = None,
        max_in_flight_per_key: int | None = None,
        reconnect: Backoff = Backoff(),
        on_verdict_error: VerdictErrorHook | None = None,
        channel_options: ChannelOptions = (),
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
        max_in_flight: int | None = None,
        concurrency: int | None = None,
        max_batch: int | None = None,
    ) -> None:
        flow = _flow_control(flow_control, max_in_flight, concurrency, max_batch)
        max_in_flight, concurrency, max_batch = flow.max_in_flight, flow.concurrency, flow.max_batch
        #: The flow control as asked (the effective `max_in_flight` is the
        #: `Subscription`'s).
        self.flow_control = flow
        if not isinstance(start, Start):
            raise TypeError("start must be a Start (Start.NEW, Start.BEGINNING, Start.after(id), Start.at(time))")
        if not stream or not group:
            raise ValueError("stream and group are required")
        if handler is not None and batch_handler is not None:
            raise TypeError("give at most one of handler and batch_handler (neither: iterate the consumer)")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1 (None: the sidecar's default)")
        iterated = handler is None and batch_handler is None
        if iterated:
            if concurrency is not None:
                raise TypeError("concurrency is for handlers; an iterated consumer runs no worker")
            concurrency = 0
        elif concurrency is None:
            # Unset with max_in_flight unset too: None, DEFAULT_CONCURRENCY
            # capped by the cap the sidecar reports, spawned when it says
            # it (_serve).
            concurrency = 1 if batch_handler is not None else max_in_flight
        if concurrency is not None and not iterated:
            if concurrency < 1 or (max_in_flight is not None and concurrency > max_in_flight):
                raise ValueError(f"concurrency must be between 1 and max_in_flight ({max_in_flight})")
        if max_batch is None:
            max_batch = DEFAULT_MAX_BATCH if max_in_flight is None else min(DEFAULT_MAX_BATCH, max_in_flight)
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        linger = seconds(ack_linger)
        if linger < 0:
            raise ValueError("ack_linger must not be negative")
        subscribe = pb.Subscribe(stream=stream, group=group, max_in_flight=max_in_flight or 0, max_batch=max_batch)
        start.apply(subscribe)
        if ack_deadline is not None:
            subscribe.ack_deadline.CopyFrom(to_duration(ack_deadline))
        if retry_backoff_initial is not None:
            subscribe.retry_backoff_initial.CopyFrom(to_duration(retry_backoff_initial))
        if retry_backoff_max is not None:
            subscribe.retry_backoff_max.CopyFrom(to_duration(retry_backoff_max))
        if dead_letter_stream:
            subscribe.dead_letter_stream = dead_letter_stream
        subscribe.max_deliveries = _uint("max_deliveries", max_deliveries)
        subscribe.no_ack = no_ack
        subscribe.key_field = key_field or ""
        subscribe.max_in_flight_per_key = _uint("max_in_flight_per_key", max_in_flight_per_key)
        self.stream = stream
        self.group = group
        #: The handler pool's size; None until the first subscribe when it is
        #: DEFAULT_CONCURRENCY or the cap the sidecar reports, whichever is
        #: smaller; 0 for an iterated consumer.
        self.concurrency: int | None = concurrency
        self.max_batch = max_batch
        self.ack_linger = linger
        #: At most once: nothing is pending, so nothing is ever released.
        self._no_ack = no_ack
        # The effective max_in_flight: as asked, until a subscribe says (_serve).
        self._max_in_flight = max_in_flight or DEFAULT_MAX_IN_FLIGHT
        self._iterated = iterated
        #: Deliveries the iteration handed out; `stop()` waits for the
        #: unsettled ones (pruned as they settle).
        self._handed: set[Delivery] = set()
        self._subscribe = pb.ConsumeRequest(subscribe=subscribe)
        self._target = target
        self._handler = handler
        self._batch_handler = batch_handler
        self._reconnect = reconnect
        self._on_verdict_error = on_verdict_error
        self._channel_options = channel_options
        self._interceptors = interceptors
        self._channel: grpc.aio.Channel | None = None
        self._owns_channel = False
        # Deliveries waiting for a worker or the iteration.
        self._ready = _Ready()
        # Created in start(), on the running loop.
        self._stopping: _Stopping | None = None
        self._subscribed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._call: _Call | None = None
        # The handler workers, and what each runs a handler for right now:
        # its slot, set once (a one-item list) and filled while a handler
        # runs (the delivery, or a batch handler's list), None while idle;
        # where `stop()` finds the busy workers and a LEASE_LOST a running
        # delivery. A slot, not a set or dict entry made and removed per
        # delivery: those cost ~5% of the consumer's Python work.
        self._workers: list[asyncio.Task[None]] = []
        self._running: dict[asyncio.Task[None], _Slot] = {}
        #: `_held`'s index of what a call holds, by id, until the next frame.
        self._held_index: tuple[_Call, dict[str, list[Delivery]]] | None = None
        self._subscription: Subscription | None = None

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Starts consuming in a background task and returns at once."""
        if self._task is not None:
            raise EchoMQError("this consumer was already started; create a new one")
        self._stopping = _Stopping()
        self._subscribed = asyncio.Event()
        if isinstance(self._target, str):
            self._channel = aio_channel(self._target, self._reconnect, self._channel_options, self._interceptors)
            self._owns_channel = True
        else:
            self._channel = self._target
        self._stub = pb_grpc.ConsumerServiceStub(self._channel)
        if self.concurrency is not None:
            self._spawn_workers(self.concurrency)  # else at the first subscribe
        self._task = asyncio.create_task(self._run(), name=f"echomq-consumer-{self.stream}-{self.group}")

    def _spawn_workers(self, count: int) -> None:
        """The fixed pool of handler workers (none for an iterated consumer)."""
        self.concurrency = count
        work = self._work if self._batch_handler is None else self._work_batches
        self._workers = [
            asyncio.create_task(work(), name=f"echomq-worker-{self.stream}-{self.group}-{i}")
            for i in range(count)
        ]

    async def run(self) -> None:
        """Starts (if needed) and consumes until `stop()`; raises `PermanentError`."""
        if self._task is None:
            await self.start()
        await self.wait()

    async def wait(self) -> None:
        """Waits until the consumer has stopped; raises the `PermanentError` that stopped it."""
        if self._task is None:
            raise EchoMQError("the consumer is not started")
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise  # our caller was cancelled, not the consumer

    async def wait_subscribed(self, timeout: Seconds | None = None) -> Subscription:
        """Waits until the current call is subscribed and returns the sidecar's
        confirmation. Raises `PermanentError` if the subscribe was refused,
        `TimeoutError` after `timeout`."""
        if self._task is None or self._subscribed is None:
            raise EchoMQError("the consumer is not started")
        task, subscribed = self._task, self._subscribed

        async def subscribed_or_stopped() -> Subscription:
            while True:
                if subscribed.is_set() and self._subscription is not None:
                    return self._subscription
                waiter = asyncio.ensure_future(subscribed.wait())
                await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    waiter.cancel()
                    if not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                    raise EchoMQError("the consumer stopped before it was subscribed")

        return await asyncio.wait_for(subscribed_or_stopped(), None if timeout is None else seconds(timeout))

    @property
    def subscription(self) -> Subscription | None:
        """The current call's confirmation, or None while not subscribed."""
        return self._subscription if self._subscribed is not None and self._subscribed.is_set() else None

    async def stop(self, deadline: Seconds = DEFAULT_STOP_DEADLINE) -> None:
        """Graceful stop: take no new work, let running handlers finish within
        `deadline` (seconds) and send their verdicts, flush the coalesced acks,
        then close the call.

        First a `Drain` goes out on the call: the sidecar hands it nothing more
        and reads nothing more for it, so the credit freed by the last verdicts
        cannot pull another entry into the group's PEL. Then a `Release` gives
        back the deliveries that no handler started (and those that arrive
        after the Drain, already on the wire): the group's other consumers get
        them at once, with the `attempts` they had, so a rolling restart costs
        no attempt and no wait for the sidecar's `--reclaim-min-idle-ms`.
        (A `no_ack` consumer releases nothing: its entries are not pending.)
        Handlers still running at the deadline are cancelled; their
        entries stay pending and are delivered again. The call then gets what is
        left of the deadline (at least `CLOSE_GRACE` seconds) to end cleanly.
        Never raises a consumer error: use `wait()` for that. Calling it again
        is harmless.

        An iterated consumer (`async for`) has no handlers: the iteration ends
        at its next step, and `stop()` waits (within `deadline`) until every
        delivery it handed out is settled, so the loop body can finish the
        one in hand. (Leaving `async with` does not wait: the body is over.)
        """
        await self._stop(deadline, wait_for_handed=True)

    async def _stop(self, deadline: Seconds, *, wait_for_handed: bool) -> None:
        if self._task is None or self._stopping is None:
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds(deadline)
        self._stopping.set()
        self._wake_iteration()
        call = self._call
        if call is not None:
            # Queued before any verdict of the handlers still running, so the
            # sidecar stops handing out (and reading) before their credit frees.
            call.drain()
            # No handler starts any more (`_stopping` is set): what waits goes back.
            self._release_unstarted(call)
        if wait_for_handed:
            while self._unsettled_handed() and loop.time() < end and not self._task.done():
                await asyncio.sleep(0.01)
        busy = self._retire_workers()
        if busy:
            _, late = await asyncio.wait(busy, timeout=max(0.0, end - loop.time()))
            if late:
                log.warning(
                    "stop: %d handler(s) still running at the deadline were cancelled; "
                    "their entries stay pending and will be delivered again",
                    len(late),
                )
                for task in late:
                    task.cancel()
                await asyncio.wait(late, timeout=CLOSE_GRACE)
        call = self._call
        if call is not None:
            call.finish()  # flushes the coalesced acks first
        if not self._task.done():
            done, _ = await asyncio.wait({self._task}, timeout=max(CLOSE_GRACE, end - loop.time()))
            if not done:
                log.warning("stop: the call did not end in time; cancelling it")
                self._task.cancel()
                await asyncio.wait({self._task})
        self._observe_task()
        await self._close_channel()

    async def abort(self) -> None:
        """Ends the call at once: no verdict for what is held (the sidecar
        returns it to the group), running handlers are cancelled, no reconnect."""
        if self._task is None or self._stopping is None:
            return
        self._stopping.set()
        if self._call is not None:
            self._call.end()
        self._task.cancel()
        await asyncio.wait({self._task})
        workers = [w for w in self._workers if not w.done()]
        for task in workers:
            task.cancel()
        if workers:
            await asyncio.wait(workers, timeout=CLOSE_GRACE)
        self._observe_task()
        await self._close_channel()

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Graceful `stop()`. For an iterated consumer the body is over, so
        nothing can settle what it left: deliveries handed out and not settled
        are failed with the exception's message when the body raised (as a
        raising handler's are), and left to the group otherwise (delivered
        again after the backoff)."""
        if self._iterated and isinstance(exc, Exception):
            reason, kind = str(exc) or type(exc).__name__, fail_kind_of(exc)
            for delivery in self._unsettled_handed():
                await delivery.fail(reason, kind=kind)
        await self._stop(DEFAULT_STOP_DEADLINE, wait_for_handed=False)

    # -- iteration ---------------------------------------------------------------

    def deliveries(self) -> AsyncIterator[Delivery]:
        """The deliveries, one at a time in arrival order, for a consumer built
        without a handler::

            async with Consumer(target, "orders", "billing", start=Start.BEGINNING) as consumer:
                async for delivery in consumer:          # the same as consumer.deliveries()
                    try:
                        await process(delivery)
                    except Exception as error:
                        await delivery.fail(str(error))  # delivered again after the backoff
                    else:
                        await delivery.ack()

        Settle every delivery explicitly: `ack()`, `fail()`, `dead_letter()`.
        Nothing is settled for you; a delivery left unsettled keeps its
        `max_in_flight` slot until it is settled, its `ack_deadline` passes,
        or the call ends (then the sidecar returns it to the group and it is
        delivered again, with `attempts + 1`). So with `max_in_flight` N, at
        most N deliveries are out at once: settling frees the next one.
        Deliveries may be settled later or from other tasks (e.g. handed to
        a task group), in any order.

        - Starts the consumer if it is not started (prefer `async with`, which
          also stops it).
        - `break`, or an exception out of the loop, only stops iterating: the
          consumer and its call stay open (iterate again to resume) until
          `stop()` or the end of `async with`. Leaving `async with` with an
          exception fails the deliveries handed out and not settled, with the
          exception's message; leaving it normally leaves them to the group.
        - The iteration ends when the consumer stops (`stop()`, `abort()`),
          and raises `PermanentError` when a permanent status stopped it.
          Reconnects are invisible: deliveries of a broken call are skipped
          (the sidecar delivers them again).
        - A delivery whose lease was lost before it was handed out is skipped.
        """
        if not self._iterated:
            raise TypeError("this consumer runs a handler; iterate a Consumer built without handler and batch_handler")
        return self._iterate()

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self.deliveries()

    async def _iterate(self) -> AsyncIterator[Delivery]:
        if self._task is None:
            await self.start()
        assert self._stopping is not None and self._task is not None
        ready, stopping = self._ready, self._stopping
        left: Delivery | None = None
        while True:
            if stopping.up:
                self._raise_if_failed()
                return
            if not ready.items:
                self._flush_acks()
                left = await ready.wait()
                continue
            delivery = ready.take(left)
            left = None
            if not delivery._call.open or delivery._lost:
                continue  # left to the group: the sidecar delivers it again
            if len(self._handed) >= 2 * self._max_in_flight:
                self._handed = set(self._unsettled_handed())
            self._handed.add(delivery)
            yield delivery

    def _unsettled_handed(self) -> list[Delivery]:
        """Deliveries the iteration handed out that may still be settled."""
        return [d for d in self._handed if not d._settled and not d._lost and d._call.open]

    def _wake_iteration(self) -> None:
        if self._iterated:
            self._ready.wake_all()

    def _raise_if_failed(self) -> None:
        task = self._task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

    # -- low-level escape hatch ------------------------------------------------

    async def send_ack(self, *ids: str) -> bool:
        """Sends a raw Ack of `ids` on the current call, whether or not this
        consumer holds them (the sidecar answers ids it did not deliver to this
        call with a verdict error). False when no call is open. Prefer
        `Delivery.ack()`."""
        call = self._call
        return call is not None and call.send(pb.ConsumeRequest(ack=pb.Ack(ids=list(ids))))

    async def send_fail(
        self,
        id: str,
        reason: str = "",
        *,
        retry_after: Seconds | None = None,
        dead_letter: bool = False,
        kind: FailKind = FailKind.MESSAGE,
    ) -> bool:
        """Sends a raw Fail of `id` on the current call (see `send_ack`)."""
        request = fail_request(id, reason, retry_after, kind, dead_letter=dead_letter)
        call = self._call
        return call is not None and call.send(request)

    # -- internals -------------------------------------------------------------

    async def _run(self) -> None:
        assert self._stopping is not None and self._subscribed is not None
        failures = 0
        what = f"Consume(stream={self.stream!r}, group={self.group!r})"
        try:
            while not self._stopping.is_set():
                call = _Call(self.ack_linger, max_ack_ids(self._max_in_flight))
                self._call = call
                try:
                    await self._serve(call)
                    if self._stopping.is_set():
                        break
                    reason = "the sidecar ended the call"
                except grpc.aio.AioRpcError as rpc_error:
                    error = from_rpc_error(what, rpc_error)
                    if isinstance(error, PermanentError):
                        log.error("%s failed permanently: %s", what, error)
                        raise error from None
                    if self._stopping.is_set():
                        break
                    reason = f"{error.code.name}: {error.details}"
                finally:
                    call.end()
                    self._subscribed.clear()
                if call.subscribed:
                    failures = 0
                delay = self._reconnect.delay(failures)
                failures += 1
                log.warning("%s: %s; reconnecting in %.2f s", what, reason, delay)
                try:
                    await asyncio.wait_for(self._stopping.wait(), delay)
                except asyncio.TimeoutError:
                    pass
        finally:
            self._call = None
            # Stopped (or failed for good): no handler starts any more.
            self._stopping.set()
            self._retire_workers()
            self._wake_iteration()

    async def _serve(self, call: _Call) -> None:
        """Runs one call until it ends; raises `grpc.aio.AioRpcError` on a non-OK status."""
        assert self._subscribed is not None
        stream = self._stub.Consume(call.requests(self._subscribe))
        try:
            async for response in stream:
                kind = response.WhichOneof("kind")
                if kind == "batch":
                    self._dispatch(call, response.batch.deliveries)
                elif kind == "delivery":
                    self._dispatch(call, (response.delivery,))
                elif kind == "emitted":
                    if not call.answer_emit(response.emitted.id, response.emitted):
                        log.debug("an Emitted for %s that no ack_emit waits for", response.emitted.id)
                elif kind == "verdict_error":
                    error = VerdictError.from_proto(response.verdict_error)
                    lost = self._held(call, error.id) if error.code is VerdictErrorCode.LEASE_LOST else ()
                    # An AckEmit's refusal goes to its caller and to the hook.
                    call.answer_emit(error.id, error)
                    for delivery in lost:
                        call.release(delivery)
                        delivery._lose()  # before the hook: it may look at the delivery
                    await self._report(error)
                elif kind == "subscribed":
                    confirmed = response.subscribed
                    self._subscription = Subscription(
                        confirmed.stream, confirmed.group, confirmed.consumer, confirmed.max_in_flight
                    )
                    call.subscribed = True
                    self._max_in_flight = confirmed.max_in_flight or self._max_in_flight
                    call.max_ack_ids = max_ack_ids(self._max_in_flight)
                    if self.concurrency is None:
                        # Before any delivery of this call.
                        self._spawn_workers(min(DEFAULT_CONCURRENCY, self._max_in_flight))
                    self._subscribed.set()
                    log.info(
                        "subscribed to %s as %s in group %s", confirmed.stream, confirmed.consumer, confirmed.group
                    )
        finally:
            call.end()
            self._held_index = None
            if not stream.done():
                stream.cancel()

    def _dispatch(self, call: _Call, messages: Iterable[pb.Delivery]) -> None:
        assert self._stopping is not None
        deliveries = Delivery._from_frame(messages, call)
        self._held_index = None  # new deliveries: `_held` indexes again
        if self._stopping.is_set():
            # On the wire when the consumer stopped: never started, so given back.
            if not self._no_ack:
                call.give_back(deliveries)
            return
        self._ready.put(deliveries)

    def _held(self, call: _Call, id: str) -> list[Delivery]:
        """The deliveries of `call` with the branded id `id` that it still
        holds, for a LEASE_LOST: not settled (waiting for a worker or the
        iteration, or in a handler's or the iteration's hands), or with an
        AckEmit in flight. Every one: a delivery that came back to the call
        with the same id while an earlier one was still in hand is the same
        lease.

        Found where they are when a LEASE_LOST comes (rare) rather than
        tracked for every delivery: a dict entry made and removed per
        delivery cost ~9% of the consumer's Python work. The places are
        indexed by id once and the index kept until the next frame (only a
        frame brings new deliveries), so a burst of LEASE_LOSTs (a peer
        reclaimed a whole window) costs one pass, not one per id."""
        index = self._held_index
        if index is None or index[0] is not call:
            by_id: dict[str, list[Delivery]] = {}
            running = [slot[0] for slot in self._running.values() if slot[0] is not None]
            for held in (*self._ready.items, *running, *self._handed, *call.held.values()):
                for delivery in held if isinstance(held, list) else (held,):
                    if delivery._call is call:
                        same = by_id.setdefault(delivery.id, [])
                        if all(delivery is not other for other in same):
                            same.append(delivery)
            index = self._held_index = (call, by_id)
        return [
            delivery
            for delivery in index[1].get(id, ())
            if not delivery._lost
            and (not delivery._settled or (id in call.emits and call.held.get(id) is delivery))
        ]

    def _release_unstarted(self, call: _Call) -> None:
        """Gives back (one `Release`) the deliveries of `call` that wait for a
        handler or the iteration and will never get one: the consumer stops.
        At most once (`no_ack`) nothing is pending, so nothing is released."""
        items = self._ready.items
        unstarted = [d for d in items if d._call is call and not d._settled and not d._lost]
        items.clear()
        if unstarted and not self._no_ack:
            call.give_back(unstarted)
            log.info("stop: released %d deliveries no handler started back to the group", len(unstarted))

    def _retire_workers(self) -> set[asyncio.Task[None]]:
        """Cancels the idle workers (no handler starts any more: `_stopping` is
        set) and returns the busy ones, which end after their current call."""
        me = asyncio.current_task()
        busy = {w for w, slot in self._running.items() if slot[0] is not None and w is not me and not w.done()}
        for worker in self._workers:
            if worker not in busy and worker is not me and not worker.done():
                worker.cancel()
        return busy

    def _idle(self) -> bool:
        """No other worker runs a handler (or is woken and has not run yet):
        all are waiting in `_ready`. Asked by a worker about to wait itself."""
        return len(self._ready._idle) >= len(self._workers) - 1

    def _slot(self, worker: asyncio.Task[None]) -> _Slot:
        """`worker`'s slot in `_running`, made now."""
        slot: _Slot = [None]
        self._running[worker] = slot
        return slot

    async def _work(self) -> None:
        """A handler worker: one delivery at a time, while there are any."""
        assert self._stopping is not None and self._handler is not None
        ready, stopping, handler = self._ready, self._stopping, self._handler
        items, idle = ready.items, ready._idle
        take = items.popleft
        call_later = asyncio.get_running_loop().call_later
        me = asyncio.current_task()
        assert me is not None
        slot = self._slot(me)
        left: Delivery | None = None
        while True:
            # Tested once per delivery: after a handler's call (stop() waits
            # for this worker to be done with it) as before the next one
            # (what waits is never started: the sidecar hands it out again).
            if stopping.up:
                return
            if not items:
                if self._idle():
                    self._flush_acks()
                left = await ready.wait()
                continue
            # `ready.take(left)`, inlined: every delivery takes this step.
            delivery = take()
            if items and ready._waking == 0 and idle:
                ready._wake(len(items) if delivery is left else 1, items[0])
            left = None
            call: _Call = delivery._call  # type: ignore[assignment]  # a consumer's deliveries are a _Call's
            if not call.open or delivery._lost:
                continue  # its call is over, or a peer has it: no handler for it
            slot[0] = delivery
            try:
                await handler(delivery)
            except asyncio.CancelledError:
                if _worker_cancelled(me, stopping):
                    _orphan((delivery,))
                    raise
                # The handler's own cancellation (not the worker's): a failure.
                if not delivery.settled:
                    await delivery.fail("CancelledError")
            except Exception as error:  # a handler's failure is a Fail verdict, not ours
                if not delivery.settled:
                    reason, kind = str(error) or type(error).__name__, fail_kind_of(error)
                    log.info(
                        "handler failed for %s (attempt %d, %s): %s",
                        delivery.id,
                        delivery.attempts,
                        kind.name.lower(),
                        reason,
                    )
                    await delivery.fail(reason, kind=kind)
            else:
                if not delivery._settled:
                    if delivery._lost or not call.open:
                        delivery._ack()  # sends nothing, and logs why
                    else:
                        # `delivery._ack()` and `call.ack(delivery)`, inlined
                        # for the usual case: every delivery whose handler
                        # returns takes this step.
                        delivery._settled = True
                        acks = call._acks
                        acks.append(delivery.id)
                        if len(acks) >= call.max_ack_ids:
                            call.flush_acks()
                        elif call._flush_timer is None:
                            call._flush_timer = call_later(call._ack_linger, call.flush_acks)
            finally:
                slot[0] = None

    async def _work_batches(self) -> None:
        """A batch handler worker: the deliveries waiting, up to `max_batch`."""
        assert self._stopping is not None and self._batch_handler is not None
        ready, stopping, handler = self._ready, self._stopping, self._batch_handler
        me = asyncio.current_task()
        assert me is not None
        slot = self._slot(me)
        left: Delivery | None = None
        while True:
            if stopping.is_set():
                return
            if not ready.items:
                if self._idle():
                    self._flush_acks()
                left = await ready.wait()
                continue
            taken = ready.take_many(self.max_batch, left)
            left = None
            batch = [d for d in taken if d._call.open and not d._lost]
            if not batch:
                continue
            slot[0] = batch
            try:
                try:
                    verdicts = await handler(batch)
                except (Exception, asyncio.CancelledError) as error:
                    if isinstance(error, asyncio.CancelledError) and _worker_cancelled(me, stopping):
                        _orphan(batch)
                        raise
                    reason = str(error) or type(error).__name__
                    log.info("batch handler failed for %d deliveries: %s", len(batch), reason)
                    await _fail_unsettled(batch, reason, fail_kind_of(error))
                else:
                    try:
                        await _settle_batch(batch, verdicts)
                    except Exception as error:  # a verdict we cannot send must not end the worker
                        reason = f"the batch handler's verdicts could not be applied: {error}"
                        log.error("%s; failing what they left unsettled", reason)
                        await _fail_unsettled(batch, reason)
            finally:
                slot[0] = None
            if stopping.is_set():
                return  # stop() waits for this worker: done with its last call

    def _flush_acks(self) -> None:
        """Sends the coalesced acks now: every delivery handed out has been
        handled (no handler runs and none waits; an iteration asks for the
        next one and none waits). The sidecar hands out no more than the
        window, so it may well be waiting for this credit: the linger would
        only delay it. Coalescing stands while handlers still run."""
        call = self._call
        if call is not None:
            call.flush_acks()

    async def _report(self, error: VerdictError) -> None:
        if self._on_verdict_error is None:
            log.warning("the sidecar did not apply a verdict for %s: %s: %s", error.id, error.code.name, error.message)
            return
        try:
            result = self._on_verdict_error(error)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("on_verdict_error raised")

    def _observe_task(self) -> None:
        """Marks the run task's exception as seen; `wait()` re-raises it."""
        if self._task is not None and self._task.done() and not self._task.cancelled():
            self._task.exception()

    async def _close_channel(self) -> None:
        if self._owns_channel and self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()


def _flow_control(
    flow_control: FlowControl | None, max_in_flight: int | None, concurrency: int | None, max_batch: int | None
) -> FlowControl:
    """`flow_control`, or the deprecated flat keywords that it replaces."""
    flat = {"max_in_flight": max_in_flight, "concurrency": concurrency, "max_batch": max_batch}
    given = [name for name, value in flat.items() if value is not None]
    if not given:
        return flow_control or FlowControl()
    if flow_control is not None:
        raise TypeError(f"give flow_control=FlowControl(...) or {', '.join(given)}, not both")
    names = ", ".join(f"{name}=" for name in given)
    deprecation.warn(f"Consumer({names}...) is deprecated: pass flow_control=FlowControl({names}...)")
    return FlowControl(max_in_flight, concurrency, max_batch)


async def _settle_batch(batch: list[Delivery], verdicts: Iterable[Verdict] | None) -> None:
    """Settles what a batch handler did not settle itself, as it answered:
    None acks them all; otherwise one verdict per delivery, in order (any
    iterable: a list, a tuple, a generator). An answer that is not that fails
    the whole batch, logged."""
    if verdicts is None:
        for delivery in batch:
            if not delivery._settled:
                delivery._ack()
        return
    try:
        answered = list(verdicts)
    except TypeError:
        answered = None
    if answered is None or len(answered) != len(batch):
        got = f"{len(answered)} verdicts" if answered is not None else f"{type(verdicts).__name__}, not verdicts"
        reason = f"the batch handler answered {got} for {len(batch)} deliveries"
        log.error("%s; failing them", reason)
        await _fail_unsettled(batch, reason)
        return
    for delivery, verdict in zip(batch, answered):
        if not delivery.settled:
            await _apply(delivery, verdict)


async def _fail_unsettled(batch: list[Delivery], reason: str, kind: FailKind = FailKind.MESSAGE) -> None:
    """Fails each delivery of `batch` that is not settled yet."""
    for delivery in batch:
        if not delivery.settled:
            await delivery.fail(reason, kind=kind)


async def _apply(delivery: Delivery, verdict: Verdict) -> None:
    """Settles `delivery` as a batch handler's `verdict` says."""
    if verdict is None or isinstance(verdict, Ack):
        delivery._ack()
    elif isinstance(verdict, Fail):
        await delivery.fail(verdict.reason, retry_after=verdict.retry_after, kind=verdict.kind)
    elif isinstance(verdict, DeadLetter):
        await delivery.dead_letter(verdict.reason)
    elif isinstance(verdict, Exception):
        await delivery.fail(str(verdict) or type(verdict).__name__, kind=fail_kind_of(verdict))
    else:
        reason = f"the batch handler answered {verdict!r}, not a verdict"
        log.error("%s for %s; failing it", reason, delivery.id)
        await delivery.fail(reason)


def _uint(name: str, value: int | None) -> int:
    """A count setting as Subscribe carries it (a uint32): None is 0, the
    sidecar's default or "unset"; the sidecar checks everything else."""
    if value is None:
        return 0
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    return value


def _orphan(deliveries: Iterable[Delivery]) -> None:
    """A stop cancelled the handler of `deliveries`: those it left unsettled
    stay held by their call (delivered again once it ends), so a LEASE_LOST
    still finds them there (`_Call.held`)."""
    for delivery in deliveries:
        call: _Call = delivery._call  # type: ignore[assignment]  # a consumer's deliveries are a _Call's
        if not delivery._settled and not delivery._lost and call.open:
            call.held[delivery.id] = delivery


def _worker_cancelled(worker: asyncio.Task[None], stopping: asyncio.Event) -> bool:
    """Whether a CancelledError is the worker's own cancellation (stop, abort,
    the loop shutting down) rather than one a handler raised by itself."""
    cancelling = getattr(worker, "cancelling", None)  # Python 3.11+
    return stopping.is_set() or cancelling is None or bool(cancelling())
