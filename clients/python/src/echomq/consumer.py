"""The asyncio consumer: one Consume call per subscription, handlers with
bounded concurrency, graceful stop, and reconnect with jittered backoff."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

import grpc

from ._channel import ChannelOptions, aio_channel
from .delivery import Delivery, VerdictError
from .errors import EchoMQError, PermanentError, from_rpc_error
from .options import Backoff, Seconds, Start, seconds, to_duration
from .v1 import consumer_service_pb2 as pb
from .v1 import consumer_service_pb2_grpc as pb_grpc

log = logging.getLogger("echomq")

#: A handler: returning acks the delivery, raising fails it with the message.
Handler = Callable[[Delivery], Awaitable[object]]
#: Called with each verdict error; may be a coroutine function. Keep it quick:
#: it runs on the task that reads the call.
VerdictErrorHook = Callable[[VerdictError], object]

#: Default `max_in_flight` (entries), the sidecar's own default.
DEFAULT_MAX_IN_FLIGHT = 64
#: Default graceful-stop deadline (seconds) of `stop()` and `async with`.
DEFAULT_STOP_DEADLINE = 10.0
#: After the handlers' deadline, the least time (seconds) `stop()` still gives
#: the sidecar to take the last verdicts and end the call.
CLOSE_GRACE = 0.5
#: Most ids merged into one Ack message when several are queued at once.
MAX_ACK_BATCH = 256


@dataclass(frozen=True)
class Subscription:
    """The sidecar's confirmation of a subscription."""

    stream: str
    group: str
    #: The sidecar's consumer name in the group.
    consumer: str
    #: The effective `max_in_flight` (entries).
    max_in_flight: int


class _Finish:
    """Queued after the last verdict: half-close the call."""


_FINISH = _Finish()


class _Call:
    """One Consume call: the queue of client messages and whether it is open.

    Deliveries keep a reference to the call they arrived on, so a verdict can
    never travel on a later call (which does not hold the id: the sidecar has
    returned the entry to the group when this call ended).
    """

    def __init__(self) -> None:
        # Unbounded on purpose: it holds at most one verdict per delivery the
        # call holds (at most max_in_flight) plus raw sends, and a verdict must
        # never wait behind a full queue while its handler slot is released.
        self._outbox: asyncio.Queue[pb.ConsumeRequest | _Finish] = asyncio.Queue()
        self.open = True
        self.subscribed = False
        self.drained = False

    def send(self, request: pb.ConsumeRequest) -> bool:
        if not self.open:
            return False
        self._outbox.put_nowait(request)
        return True

    def drain(self) -> bool:
        """Asks the sidecar for no further deliveries on this call; verdicts
        still work. Sent once; false when the call is closed or already drained."""
        if self.drained:
            return False
        self.drained = self.send(pb.ConsumeRequest(drain=pb.Drain()))
        return self.drained

    def finish(self) -> None:
        """Sends what is queued, then half-closes; later sends are refused."""
        if self.open:
            self.open = False
            self._outbox.put_nowait(_FINISH)

    def end(self) -> None:
        """The call is over: later sends are refused, and `requests()` returns
        (without this, gRPC's task pulling it would wait forever on a broken
        call and be destroyed pending)."""
        if self.open:
            self.open = False
            self._outbox.put_nowait(_FINISH)

    async def requests(self, subscribe: pb.ConsumeRequest) -> AsyncIterator[pb.ConsumeRequest]:
        """The client side of the call: the subscribe, then queued messages.
        Acks queued together travel as one Ack message."""
        yield subscribe
        held: pb.ConsumeRequest | _Finish | None = None
        while True:
            item = held if held is not None else await self._outbox.get()
            held = None
            if isinstance(item, _Finish):
                return
            if item.WhichOneof("kind") == "ack":
                ids = list(item.ack.ids)
                while len(ids) < MAX_ACK_BATCH and not self._outbox.empty():
                    following = self._outbox.get_nowait()
                    if isinstance(following, pb.ConsumeRequest) and following.WhichOneof("kind") == "ack":
                        ids.extend(following.ack.ids)
                    else:
                        held = following
                        break
                item = pb.ConsumeRequest(ack=pb.Ack(ids=ids))
            yield item


class Consumer:
    """Consumes a stream through a consumer group that the sidecar owns.

    ::

        async with Consumer("127.0.0.1:50051", "orders", "billing", handle,
                            start=Start.BEGINNING) as consumer:
            await consumer.wait()   # until stop() or a permanent error

    `target` is `host:port`, `unix:/path`, or a `grpc.aio.Channel` you own.
    `start` is required (see `Start`). `max_in_flight` (entries, default 64) is
    the most deliveries the sidecar hands this consumer un-settled;
    `concurrency` (default: `max_in_flight`, at most that) the most handlers
    running at once. `ack_deadline`, `retry_backoff_initial`,
    `retry_backoff_max` (seconds or timedelta), `dead_letter_stream` and
    `max_deliveries` (poison entries go to the dead-letter stream after that
    many deliveries) are the subscription's policy; None leaves the sidecar's
    default. `no_ack=True` is the AT-MOST-ONCE mode: entries are never pending,
    so one whose handler fails, raises or never finishes is LOST (no retry, no
    dead letter); ask for it only when losing entries is acceptable. `reconnect` is the
    backoff between reconnect attempts. `on_verdict_error` observes verdicts the
    sidecar did not apply (default: a warning on the `echomq` logger).
    `channel_options` and `interceptors` apply when the consumer creates the
    channel itself.

    When the call breaks (UNAVAILABLE, a refused connection, a sidecar restart)
    the consumer reconnects by itself and subscribes again with the same
    settings. A permanent status (INVALID_ARGUMENT, PERMISSION_DENIED,
    UNAUTHENTICATED, FAILED_PRECONDITION, UNIMPLEMENTED) stops it: `wait()`,
    `run()` and `wait_subscribed()` raise it as `PermanentError`.
    """

    def __init__(
        self,
        target: str | grpc.aio.Channel,
        stream: str,
        group: str,
        handler: Handler,
        *,
        start: Start,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        concurrency: int | None = None,
        ack_deadline: Seconds | None = None,
        retry_backoff_initial: Seconds | None = None,
        retry_backoff_max: Seconds | None = None,
        dead_letter_stream: str | None = None,
        max_deliveries: int | None = None,
        no_ack: bool = False,
        reconnect: Backoff = Backoff(),
        on_verdict_error: VerdictErrorHook | None = None,
        channel_options: ChannelOptions = (),
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    ) -> None:
        if not isinstance(start, Start):
            raise TypeError("start must be a Start (Start.NEW, Start.BEGINNING, Start.after(id), Start.at(time))")
        if not stream or not group:
            raise ValueError("stream and group are required")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        concurrency = max_in_flight if concurrency is None else concurrency
        if not 1 <= concurrency <= max_in_flight:
            raise ValueError(f"concurrency must be between 1 and max_in_flight ({max_in_flight})")
        subscribe = pb.Subscribe(stream=stream, group=group, max_in_flight=max_in_flight)
        start.apply(subscribe)
        if ack_deadline is not None:
            subscribe.ack_deadline.CopyFrom(to_duration(ack_deadline))
        if retry_backoff_initial is not None:
            subscribe.retry_backoff_initial.CopyFrom(to_duration(retry_backoff_initial))
        if retry_backoff_max is not None:
            subscribe.retry_backoff_max.CopyFrom(to_duration(retry_backoff_max))
        if dead_letter_stream:
            subscribe.dead_letter_stream = dead_letter_stream
        if max_deliveries is not None:
            if max_deliveries < 0:
                raise ValueError("max_deliveries must not be negative")
            subscribe.max_deliveries = max_deliveries
        subscribe.no_ack = no_ack
        self.stream = stream
        self.group = group
        self.concurrency = concurrency
        self._subscribe = pb.ConsumeRequest(subscribe=subscribe)
        self._target = target
        self._handler = handler
        self._reconnect = reconnect
        self._on_verdict_error = on_verdict_error
        self._channel_options = channel_options
        self._interceptors = interceptors
        self._channel: grpc.aio.Channel | None = None
        self._owns_channel = False
        # Created in start(), on the running loop.
        self._slots: asyncio.Semaphore | None = None
        self._stopping: asyncio.Event | None = None
        self._subscribed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._call: _Call | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._subscription: Subscription | None = None

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Starts consuming in a background task and returns at once."""
        if self._task is not None:
            raise EchoMQError("this consumer was already started; create a new one")
        self._slots = asyncio.Semaphore(self.concurrency)
        self._stopping = asyncio.Event()
        self._subscribed = asyncio.Event()
        if isinstance(self._target, str):
            self._channel = aio_channel(self._target, self._reconnect, self._channel_options, self._interceptors)
            self._owns_channel = True
        else:
            self._channel = self._target
        self._stub = pb_grpc.ConsumerServiceStub(self._channel)
        self._task = asyncio.create_task(self._run(), name=f"echomq-consumer-{self.stream}-{self.group}")

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
        `deadline` (seconds) and send their verdicts, then close the call.

        First a `Drain` goes out on the call: the sidecar hands it nothing more
        and reads nothing more for it, so the credit freed by the last verdicts
        cannot pull another entry into the group's PEL. Deliveries that arrive
        after it (already on the wire) and deliveries that no handler started
        are left un-settled: the sidecar returns them to the group when the call
        ends. Handlers still running at the deadline are cancelled; their
        entries stay pending and are delivered again. The call then gets what is
        left of the deadline (at least `CLOSE_GRACE` seconds) to end cleanly.
        Never raises a consumer error: use `wait()` for that. Calling it again
        is harmless.
        """
        if self._task is None or self._stopping is None:
            return
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds(deadline)
        self._stopping.set()
        call = self._call
        if call is not None:
            # Queued before any verdict of the handlers still running, so the
            # sidecar stops handing out (and reading) before their credit frees.
            call.drain()
        handlers = set(self._handlers)
        if handlers:
            _, late = await asyncio.wait(handlers, timeout=max(0.0, end - loop.time()))
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
            call.finish()
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
        handlers = set(self._handlers)
        for task in handlers:
            task.cancel()
        if handlers:
            await asyncio.wait(handlers, timeout=CLOSE_GRACE)
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
        await self.stop()

    # -- low-level escape hatch ------------------------------------------------

    async def send_ack(self, *ids: str) -> bool:
        """Sends a raw Ack of `ids` on the current call, whether or not this
        consumer holds them (the sidecar answers ids it did not deliver to this
        call with a verdict error). False when no call is open. Prefer
        `Delivery.ack()`."""
        call = self._call
        return call is not None and call.send(pb.ConsumeRequest(ack=pb.Ack(ids=list(ids))))

    async def send_fail(
        self, id: str, reason: str = "", *, retry_after: Seconds | None = None, dead_letter: bool = False
    ) -> bool:
        """Sends a raw Fail of `id` on the current call (see `send_ack`)."""
        fail = pb.Fail(id=id, reason=reason, dead_letter=dead_letter)
        if retry_after is not None:
            fail.retry_after.CopyFrom(to_duration(retry_after))
        call = self._call
        return call is not None and call.send(pb.ConsumeRequest(fail=fail))

    # -- internals -------------------------------------------------------------

    async def _run(self) -> None:
        assert self._stopping is not None and self._subscribed is not None
        failures = 0
        what = f"Consume(stream={self.stream!r}, group={self.group!r})"
        try:
            while not self._stopping.is_set():
                call = _Call()
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

    async def _serve(self, call: _Call) -> None:
        """Runs one call until it ends; raises `grpc.aio.AioRpcError` on a non-OK status."""
        assert self._subscribed is not None
        stream = self._stub.Consume(call.requests(self._subscribe))
        try:
            async for response in stream:
                kind = response.WhichOneof("kind")
                if kind == "delivery":
                    self._dispatch(call, response.delivery)
                elif kind == "verdict_error":
                    await self._report(VerdictError.from_proto(response.verdict_error))
                elif kind == "subscribed":
                    confirmed = response.subscribed
                    self._subscription = Subscription(
                        confirmed.stream, confirmed.group, confirmed.consumer, confirmed.max_in_flight
                    )
                    call.subscribed = True
                    self._subscribed.set()
                    log.info(
                        "subscribed to %s as %s in group %s", confirmed.stream, confirmed.consumer, confirmed.group
                    )
        finally:
            call.end()
            if not stream.done():
                stream.cancel()

    def _dispatch(self, call: _Call, message: pb.Delivery) -> None:
        assert self._stopping is not None
        if self._stopping.is_set():
            return  # stopping: left held; the sidecar returns it to the group when the call ends
        delivery = Delivery.from_proto(message, call)
        task = asyncio.create_task(self._handle(call, delivery), name=f"echomq-handler-{delivery.id}")
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _handle(self, call: _Call, delivery: Delivery) -> None:
        assert self._slots is not None and self._stopping is not None
        async with self._slots:
            if self._stopping.is_set() or not call.open:
                return  # never started: the sidecar hands it out again
            try:
                await self._handler(delivery)
            except Exception as error:  # a handler's failure is a Fail verdict, not ours
                if not delivery.settled:
                    reason = str(error) or type(error).__name__
                    log.info("handler failed for %s (attempt %d): %s", delivery.id, delivery.attempts, reason)
                    await delivery.fail(reason)
            else:
                if not delivery.settled:
                    await delivery.ack()

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
