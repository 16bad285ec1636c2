"""A blocking facade for scripts, derived from the asyncio API rather than
restating it: `Streams` and `Admin` run an `echomq.Streams` / `echomq.Admin`
on a private event loop thread and block on each call (every method is the
asyncio one, with its signature and docs, wrapped by `_blocking` or, for the
async iterators, `_blocking_iter`); `Consumer` runs the asyncio consumer on
its own event loop and calls a plain function per delivery on a thread pool.

::

    from echomq import Start
    from echomq.sync import Consumer, Streams

    with Streams("127.0.0.1:50051") as streams:
        streams.append("orders", {"sku": b"42"})

    def handle(delivery):          # return: ack; raise: fail with the message
        print(delivery.id, delivery.payload)

    Consumer("127.0.0.1:50051", "orders", "billing", handle, start=Start.BEGINNING).run()
    # blocks until SIGINT / SIGTERM (graceful stop) or consumer.stop() from another thread

`Producer` is the deprecated name of `Streams`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import signal
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar

from . import admin as aio_admin
from . import consumer as aio
from . import streams as aio_streams
from ._channel import AioClient, ChannelOptions
from ._deprecation import renamed_class
from .delivery import Delivery, RawField
from .errors import EchoMQError
from .options import FlowControl, Seconds, seconds

__all__ = ["Admin", "Consumer", "Producer", "Streams", "SyncDelivery"]


T = TypeVar("T")
P = ParamSpec("P")
A = TypeVar("A")


class _OnLoop(Generic[A]):
    """Something asyncio (`_aio`) driven from other threads: `_run` runs one
    of its coroutines on `_loop` and waits for the result (or its exception,
    unchanged: `RpcError`, `PermanentError`, `ValueError` …)."""

    _aio: A
    _loop: asyncio.AbstractEventLoop

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()


def _blocking(method: Callable[Concatenate[Any, P], Awaitable[T]]) -> Callable[Concatenate[_OnLoop[Any], P], T]:
    """The blocking twin of an asyncio method: same name, parameters and docs
    (`inspect.signature` and `help()` show the asyncio one's), run on the
    owner's loop."""
    name = method.__name__

    def call(self: _OnLoop[Any], /, *args: P.args, **kwargs: P.kwargs) -> T:
        async def run() -> T:
            result: T = await getattr(self._aio, name)(*args, **kwargs)
            return result

        return self._run(run())

    functools.update_wrapper(call, method)
    return call


def _blocking_iter(
    method: Callable[Concatenate[Any, P], AsyncIterator[T]],
) -> Callable[Concatenate[_OnLoop[Any], P], Iterator[T]]:
    """The blocking twin of an asyncio async-iterator method: a plain
    iterator, as lazy (nothing is called before the first `next`), that
    closes the async one when it is closed or dropped."""
    name = method.__name__

    def call(self: _OnLoop[Any], /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        iterator: AsyncIterator[T] = getattr(self._aio, name)(*args, **kwargs)

        async def step() -> T:
            return await iterator.__anext__()

        async def close() -> None:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()

        try:
            while True:
                try:
                    item = self._run(step())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if self._loop.is_running():  # not once the client is closed
                self._run(close())

    functools.update_wrapper(call, method)
    signature = inspect.signature(method)
    returns = str(signature.return_annotation).replace("AsyncIterator[", "Iterator[", 1)
    call.__signature__ = signature.replace(return_annotation=returns)  # type: ignore[attr-defined]
    return call


C = TypeVar("C", bound=AioClient)


def _shut_down(loop: asyncio.AbstractEventLoop, thread: threading.Thread, client: AioClient | None) -> None:
    """Closes `client` on `loop` (if given), then stops the loop and ends its thread."""
    if loop.is_closed():
        return
    try:
        if client is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(client.close(), loop).result(10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        if not loop.is_running():
            loop.close()


_Self = TypeVar("_Self", bound="_Client[Any]")


class _Client(_OnLoop[C]):
    """An asyncio client (`_aio_class`) on a private event loop thread, made
    there from the same `target`, `timeout` and `channel_options`, and closed
    with its thread by `close()`, the end of the `with` block, or when the
    client is dropped unclosed. `target` is `host:port` or `unix:/path` (a
    channel of your own is the asyncio client's business: its loop is its
    own)."""

    _aio_class: type[C]

    def __init__(self, target: str, *, timeout: Seconds | None = None, channel_options: ChannelOptions = ()) -> None:
        if not isinstance(target, str):
            raise TypeError(
                f"echomq.sync clients take a `host:port` or `unix:/path` target, not {type(target).__name__}; "
                "bring your own channel to the asyncio client instead"
            )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="echomq-sync", daemon=True)
        self._thread.start()

        async def make() -> C:
            return self._aio_class(target, timeout=timeout, channel_options=channel_options)

        try:
            self._aio = self._run(make())
        except BaseException:
            _shut_down(self._loop, self._thread, None)
            raise
        # close(), or the client dropped unclosed (or the interpreter exiting):
        # the channel is closed and the thread ends either way, once.
        self._shut_down = weakref.finalize(self, _shut_down, self._loop, self._thread, self._aio)

    def close(self) -> None:
        """Closes the channel and ends the client's loop thread."""
        self._shut_down()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


class Streams(_Client[aio_streams.Streams]):
    """The blocking twin of `echomq.Streams`: append, read, trim and the
    scheduled entries' calls (same
    arguments, same errors, iterators instead of async iterators)."""

    _aio_class = aio_streams.Streams

    append = _blocking(aio_streams.Streams.append)
    append_batch = _blocking(aio_streams.Streams.append_batch)
    read = _blocking(aio_streams.Streams.read)
    read_pages = _blocking_iter(aio_streams.Streams.read_pages)
    read_all = _blocking_iter(aio_streams.Streams.read_all)
    trim = _blocking(aio_streams.Streams.trim)
    cancel_scheduled = _blocking(aio_streams.Streams.cancel_scheduled)
    list_scheduled = _blocking(aio_streams.Streams.list_scheduled)
    scheduled = _blocking_iter(aio_streams.Streams.scheduled)


if TYPE_CHECKING:
    Producer = Streams
else:
    #: Deprecated: the old name of `Streams`, which appends, reads and trims.
    Producer = renamed_class(Streams, "echomq.sync.Producer", "echomq.sync.Streams")


class Admin(_Client[aio_admin.Admin]):
    """The blocking twin of `echomq.Admin` (same methods, same errors,
    iterators instead of async iterators)."""

    _aio_class = aio_admin.Admin

    describe_group = _blocking(aio_admin.Admin.describe_group)
    list_dead_letters = _blocking(aio_admin.Admin.list_dead_letters)
    dead_letters = _blocking_iter(aio_admin.Admin.dead_letters)
    replay_dead_letters = _blocking(aio_admin.Admin.replay_dead_letters)


class SyncDelivery(_OnLoop[Delivery]):
    """A `Delivery` for a blocking handler: the same attributes, blocking
    `ack()`, `fail()`, `dead_letter()`, `extend()` and `ack_emit()` (safe from
    the handler's worker thread).

    `lease_lost` is a `threading.Event`, set when the sidecar reports
    LEASE_LOST for this delivery (a peer reclaimed the entry): a long handler
    should check it (`lease_lost.is_set()`, `lease_lost.wait(timeout)`) and
    give up; the thread is not interrupted. No verdict is sent for the
    delivery afterwards, whatever the handler returns.
    """

    def __init__(self, delivery: Delivery, loop: asyncio.AbstractEventLoop) -> None:
        self._aio = delivery
        self._loop = loop
        self.id: str = delivery.id
        self.stream_id: str = delivery.stream_id
        self.stream: str = delivery.stream
        self.group: str = delivery.group
        self.payload: dict[str, bytes] = delivery.payload
        self.raw_fields: list[RawField] = delivery.raw_fields
        self.attempts: int = delivery.attempts
        self.minted_at: datetime = delivery.minted_at
        self.traceparent: str = delivery.traceparent
        self.lease_lost = threading.Event()
        # Constructed on the consumer's loop, where LEASE_LOST is handled.
        delivery._on_lease_lost(self.lease_lost.set)

    @property
    def settled(self) -> bool:
        return self._aio.settled

    ack = _blocking(Delivery.ack)
    fail = _blocking(Delivery.fail)
    dead_letter = _blocking(Delivery.dead_letter)
    extend = _blocking(Delivery.extend)
    ack_emit = _blocking(Delivery.ack_emit)

    def __repr__(self) -> str:
        return f"Sync{self._aio!r}"


class Consumer:
    """The blocking twin of `echomq.Consumer`: same arguments (no
    `batch_handler`), but `handler` and `on_verdict_error` are plain
    functions. Handlers run on a pool of `concurrency` threads. `run()` blocks
    until `stop()` (from another thread, or SIGINT/SIGTERM when `run()` is on
    the main thread) and raises `PermanentError` like the asyncio consumer. A
    thread cannot be cancelled: a handler still running at the stop deadline
    finishes in the background, its verdict dropped (the entry is delivered
    again).

    Without a handler it is iterated instead, with the asyncio consumer's
    rules (see `echomq.Consumer.deliveries`)::

        with Consumer(target, "orders", "billing", start=Start.BEGINNING) as consumer:
            for delivery in consumer:
                process(delivery)
                delivery.ack()        # settle each one: fail(), dead_letter() …

    The asyncio consumer then runs on an event loop in a background thread;
    leaving the `with` block stops it (an exception out of the block fails
    the deliveries handed out and not settled; a normal exit leaves them to
    the group) and ends that thread.
    """

    def __init__(
        self,
        target: str,
        stream: str,
        group: str,
        handler: Callable[[SyncDelivery], object] | None = None,
        *,
        stop_deadline: Seconds = aio.DEFAULT_STOP_DEADLINE,
        **settings: Any,
    ) -> None:
        # `settings` are `echomq.Consumer`'s keyword arguments, passed on as
        # they are (`__signature__` below lists them), but for the handler's.
        for name in ("batch_handler", "interceptors"):
            if name in settings:
                raise TypeError(f"echomq.sync.Consumer takes no {name} (the asyncio echomq.Consumer does)")
        self._handler = handler
        self._stop_deadline = stop_deadline
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The background thread running `_loop` for an iterated consumer.
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._consumer = aio.Consumer(
            target, stream, group, self._run_handler if handler is not None else None, **settings
        )
        # Threads start as work needs them; the asyncio consumer's workers
        # (`concurrency`: by default max_in_flight when set, else
        # DEFAULT_CONCURRENCY) bound how many handlers run at once, so the
        # pool's cap only has to be enough: never one thread per slot of the
        # adaptive window's cap (1024).
        flow: FlowControl = self._consumer.flow_control
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=flow.concurrency or flow.max_in_flight or aio.DEFAULT_CONCURRENCY,
            thread_name_prefix="echomq-handler",
        )

    async def _run_handler(self, delivery: Delivery) -> None:
        assert self._handler is not None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, self._handler, SyncDelivery(delivery, loop))

    # -- the iterated form ------------------------------------------------------------

    def deliveries(self) -> Iterator[SyncDelivery]:
        """The deliveries, one at a time, for a consumer built without a
        handler (see the class doc; the rules are `echomq.Consumer.deliveries`'s).
        Ends when the consumer stops; raises `PermanentError` when a permanent
        status stopped it."""
        if self._handler is not None:
            raise TypeError("this consumer runs a handler; iterate a Consumer built without one")
        loop = self._start_loop()
        iterator = self._consumer.deliveries()

        async def next_delivery() -> SyncDelivery:
            # Built on the loop's thread, where LEASE_LOST is handled.
            return SyncDelivery(await iterator.__anext__(), loop)

        while not loop.is_closed():
            try:
                delivery = asyncio.run_coroutine_threadsafe(next_delivery(), loop).result()
            except (StopAsyncIteration, concurrent.futures.CancelledError):
                return  # stopped (the loop's tasks are cancelled when it closes)
            yield delivery

    def __iter__(self) -> Iterator[SyncDelivery]:
        return self.deliveries()

    def __enter__(self) -> Consumer:
        if self._handler is not None:
            raise TypeError("use run() for a consumer with a handler; `with` is for iterating one")
        self._start_loop()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            # The asyncio consumer's own exit: fail what the body held on an
            # exception, leave it to the group otherwise, stop gracefully.
            asyncio.run_coroutine_threadsafe(self._consumer.__aexit__(exc_type, exc, traceback), loop).result()
        self._close_loop()

    def _start_loop(self) -> asyncio.AbstractEventLoop:
        """The background loop of an iterated consumer, started once."""
        if self._loop is not None:
            return self._loop
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="echomq-loop", daemon=True)
        self._thread.start()
        self._loop = loop
        asyncio.run_coroutine_threadsafe(self._consumer.start(), loop).result()
        self._ready.set()
        return loop

    def _close_loop(self) -> None:
        """Ends the background loop: what still runs there (an iteration
        waiting for its next delivery) is cancelled, then the thread ends."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or loop.is_closed():
            return

        async def cancel_the_rest() -> None:
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            await loop.shutdown_asyncgens()

        if loop.is_running():
            asyncio.run_coroutine_threadsafe(cancel_the_rest(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- the handler form -------------------------------------------------------------

    def run(self) -> None:
        """Consumes until stopped; raises `PermanentError` on a permanent failure."""
        if self._handler is None:
            raise TypeError("a consumer without a handler is iterated: `for delivery in consumer`")
        try:
            asyncio.run(self._main())
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._loop.add_signal_handler(signum, self._stop_soon)
        await self._consumer.start()
        self._ready.set()
        await self._consumer.wait()

    def _stop_soon(self) -> None:
        asyncio.ensure_future(self._consumer.stop(self._stop_deadline))

    def wait_subscribed(self, timeout: Seconds | None = 30.0) -> aio.Subscription:
        """Blocks until subscribed (call from another thread than `run()`)."""
        if not self._ready.wait(None if timeout is None else seconds(timeout)) or self._loop is None:
            raise EchoMQError("the consumer is not running")
        future = asyncio.run_coroutine_threadsafe(self._consumer.wait_subscribed(timeout), self._loop)
        return future.result()

    def stop(self, deadline: Seconds | None = None) -> None:
        """Graceful stop (see `echomq.Consumer.stop`); call it from another
        thread than `run()`. Returns when the consumer has stopped."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if threading.get_ident() == getattr(loop, "_thread_id", None):
            self._stop_soon()
            return
        deadline = self._stop_deadline if deadline is None else deadline
        asyncio.run_coroutine_threadsafe(self._consumer.stop(deadline), loop).result()
        if self._thread is not None:
            self._close_loop()  # an iterated consumer's background loop

    def send_ack(self, *ids: str) -> bool:
        """The raw escape hatch; see `echomq.Consumer.send_ack`."""
        if self._loop is None:
            return False
        return asyncio.run_coroutine_threadsafe(self._consumer.send_ack(*ids), self._loop).result()


def _consumer_signature() -> inspect.Signature:
    """`echomq.Consumer`'s parameters, with a plain-function handler, without
    the asyncio-only ones, and with `stop_deadline` (what `stop()` waits by
    default, also on SIGINT / SIGTERM)."""
    parameters = []
    for parameter in inspect.signature(aio.Consumer.__init__).parameters.values():
        if parameter.name in ("batch_handler", "interceptors"):
            continue
        if parameter.name == "target":
            parameter = parameter.replace(annotation="str")
        elif parameter.name == "handler":
            parameter = parameter.replace(annotation="Callable[[SyncDelivery], object] | None")
        parameters.append(parameter)
    parameters.append(
        inspect.Parameter(
            "stop_deadline", inspect.Parameter.KEYWORD_ONLY, default=aio.DEFAULT_STOP_DEADLINE, annotation="Seconds"
        )
    )
    return inspect.Signature(parameters, return_annotation="None")


Consumer.__init__.__signature__ = _consumer_signature()  # type: ignore[attr-defined]
