"""A small blocking facade for scripts: `Producer`, `Streams` and `Admin` on
gRPC's blocking stubs, and `Consumer`, which runs the asyncio consumer on its
own event loop and calls a plain function per delivery on a thread pool.

::

    from echomq import Start
    from echomq.sync import Consumer, Producer

    with Producer("127.0.0.1:50051") as producer:
        producer.append("orders", {"sku": b"42"})

    def handle(delivery):          # return: ack; raise: fail with the message
        print(delivery.id, delivery.payload)

    Consumer("127.0.0.1:50051", "orders", "billing", handle, start=Start.BEGINNING).run()
    # blocks until SIGINT / SIGTERM (graceful stop) or consumer.stop() from another thread
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import grpc

from . import _convert
from . import consumer as aio
from ._channel import BlockingClient, ChannelOptions
from ._convert import Bound
from .delivery import Delivery, RawField, VerdictError
from .errors import EchoMQError, from_rpc_error
from .options import Backoff, Seconds, Start, seconds
from .producer import Appended, BatchEntry, Fields, append_batch_request, append_request, appended
from .records import DeadLetterEntry, DeadLetterPage, Entry, GroupInfo, ReadPage, ReplayResult, Trimmed
from .v1 import admin_service_pb2_grpc as admin_grpc
from .v1 import stream_service_pb2_grpc as stream_grpc

__all__ = ["Admin", "Consumer", "Producer", "Streams", "SyncDelivery"]


T = TypeVar("T")


class Producer(BlockingClient):
    """The blocking twin of `echomq.Producer` (same methods, same errors)."""

    def __init__(
        self, target: str | grpc.Channel, *, timeout: Seconds | None = None, channel_options: ChannelOptions = ()
    ) -> None:
        super().__init__(target, None if timeout is None else seconds(timeout), channel_options)
        self._stub = stream_grpc.StreamServiceStub(self._channel)

    def append(
        self,
        stream: str,
        fields: Fields,
        *,
        max_len: int = 0,
        partition_key: str | None = None,
        dedup_key: str | None = None,
    ) -> Appended:
        """Appends one entry; see `echomq.Producer.append` (and there for
        `partition_key`, a sharded stream's shard choice, and `dedup_key`,
        which makes a retry safe)."""
        request = append_request(stream, fields, max_len, partition_key, dedup_key)
        try:
            response = self._stub.Append(request, timeout=self._timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(f"Append(stream={stream!r})", error) from None
        return appended(response)

    def append_batch(
        self,
        stream: str,
        entries: Iterable[Fields | BatchEntry],
        *,
        max_len: int = 0,
        partition_key: str | None = None,
    ) -> list[Appended]:
        """Appends a batch atomically; see `echomq.Producer.append_batch`
        (entries may be `BatchEntry`s with a dedup key)."""
        request = append_batch_request(stream, entries, max_len, partition_key)
        try:
            response = self._stub.AppendBatch(request, timeout=self._timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(f"AppendBatch(stream={stream!r}, entries={len(request.entries)})", error) from None
        return [appended(e) for e in response.entries]



class Streams(Producer):
    """The blocking twin of `echomq.Streams`: append, read and trim (same
    arguments, same errors, iterators instead of async iterators)."""

    def read(self, stream: str, *, start: Bound | None = None, end: Bound | None = None, count: int = 0) -> ReadPage:
        """One page of `stream`; see `echomq.Streams.read`."""
        request = _convert.read_request(stream, start, end, count)
        try:
            response = self._stub.Read(request, timeout=self._timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(f"Read(stream={stream!r})", error) from None
        return _convert.read_page(response)

    def read_pages(
        self, stream: str, *, start: Bound | None = None, end: Bound | None = None, page_size: int = 0
    ) -> Iterator[ReadPage]:
        """Every page of the range, following `next_start_id`."""
        while True:
            page = self.read(stream, start=start, end=end, count=page_size)
            yield page
            if page.next_start_id is None:
                return
            start = page.next_start_id

    def read_all(
        self, stream: str, *, start: Bound | None = None, end: Bound | None = None, page_size: int = 0
    ) -> Iterator[Entry]:
        """Every entry of the range, oldest first, page by page."""
        for page in self.read_pages(stream, start=start, end=end, page_size=page_size):
            yield from page.entries

    def trim(
        self,
        stream: str,
        *,
        max_len: int | None = None,
        min_id: str | None = None,
        before: datetime | None = None,
        approximate: bool = False,
        ignore_groups: bool = False,
    ) -> Trimmed:
        """Trims `stream`, safe by default; see `echomq.Streams.trim`."""
        request = _convert.trim_request(stream, max_len, min_id, before, approximate, ignore_groups)
        try:
            response = self._stub.Trim(request, timeout=self._timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(f"Trim(stream={stream!r})", error) from None
        return _convert.trimmed(response)


class Admin(BlockingClient):
    """The blocking twin of `echomq.Admin` (same methods, same errors)."""

    def __init__(
        self, target: str | grpc.Channel, *, timeout: Seconds | None = None, channel_options: ChannelOptions = ()
    ) -> None:
        super().__init__(target, None if timeout is None else seconds(timeout), channel_options)
        self._stub = admin_grpc.AdminServiceStub(self._channel)

    def describe_group(self, stream: str, group: str) -> GroupInfo:
        """A group's state; see `echomq.Admin.describe_group`."""
        request = _convert.describe_request(stream, group)
        try:
            response = self._stub.DescribeGroup(request, timeout=self._timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(f"DescribeGroup(stream={stream!r}, group={group!r})", error) from None
        return _convert.group_info(response)

    def list_dead_letters(
        self, stream: str, *, dead_letter_stream: str | None = None, start_id: str | None = None, count: int = 0
    ) -> DeadLetterPage:
        """One page of dead letters; see `echomq.Admin.list_dead_letters`."""
        request = _convert.list_dead_letters_request(stream, dead_letter_stream, start_id, count)
        try:
            response = self._stub.ListDeadLetters(request, timeout=self._timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(f"ListDeadLetters(stream={stream!r})", error) from None
        return _convert.dead_letter_page(response)

    def dead_letters(
        self, stream: str, *, dead_letter_stream: str | None = None, page_size: int = 0
    ) -> Iterator[DeadLetterEntry]:
        """Every dead letter of `stream`, oldest first, page by page."""
        start: str | None = None
        while True:
            page = self.list_dead_letters(
                stream, dead_letter_stream=dead_letter_stream, start_id=start, count=page_size
            )
            yield from page.dead_letters
            if page.next_start_id is None:
                return
            start = page.next_start_id

    def replay_dead_letters(
        self, stream: str, *, ids: Iterable[str] = (), dead_letter_stream: str | None = None, count: int = 0
    ) -> ReplayResult:
        """Moves dead letters back to `stream`; see `echomq.Admin.replay_dead_letters`."""
        request = _convert.replay_request(stream, ids, dead_letter_stream, count)
        try:
            response = self._stub.ReplayDeadLetters(request, timeout=self._timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(f"ReplayDeadLetters(stream={stream!r})", error) from None
        return _convert.replay_result(response)



class SyncDelivery:
    """A `Delivery` for a blocking handler: the same attributes, blocking
    `ack()`, `fail()`, `dead_letter()` and `extend()` (safe from the handler's
    worker thread).

    `lease_lost` is a `threading.Event`, set when the sidecar reports
    LEASE_LOST for this delivery (a peer reclaimed the entry): a long handler
    should check it (`lease_lost.is_set()`, `lease_lost.wait(timeout)`) and
    give up; the thread is not interrupted. No verdict is sent for the
    delivery afterwards, whatever the handler returns.
    """

    def __init__(self, delivery: Delivery, loop: asyncio.AbstractEventLoop) -> None:
        self._delivery = delivery
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
        return self._delivery.settled

    def _on_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def ack(self) -> bool:
        return self._on_loop(self._delivery.ack())

    def fail(self, reason: str = "", *, retry_after: Seconds | None = None) -> bool:
        return self._on_loop(self._delivery.fail(reason, retry_after=retry_after))

    def dead_letter(self, reason: str = "") -> bool:
        return self._on_loop(self._delivery.dead_letter(reason))

    def extend(self, by: Seconds) -> bool:
        return self._on_loop(self._delivery.extend(by))

    def __repr__(self) -> str:
        return f"Sync{self._delivery!r}"


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
        start: Start,
        max_in_flight: int | None = None,
        concurrency: int | None = None,
        max_batch: int | None = None,
        ack_linger: Seconds = aio.DEFAULT_ACK_LINGER,
        ack_deadline: Seconds | None = None,
        retry_backoff_initial: Seconds | None = None,
        retry_backoff_max: Seconds | None = None,
        dead_letter_stream: str | None = None,
        max_deliveries: int | None = None,
        no_ack: bool = False,
        reconnect: Backoff = Backoff(),
        on_verdict_error: Callable[[VerdictError], object] | None = None,
        channel_options: ChannelOptions = (),
        stop_deadline: Seconds = aio.DEFAULT_STOP_DEADLINE,
    ) -> None:
        self._handler = handler
        self._stop_deadline = stop_deadline
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The background thread running `_loop` for an iterated consumer.
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        # Threads start as work needs them; the asyncio consumer's workers
        # (`concurrency`, by default the effective max_in_flight) bound how
        # many handlers run at once, so the pool's cap only has to be enough.
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=concurrency or max_in_flight or aio.MAX_IN_FLIGHT_LIMIT, thread_name_prefix="echomq-handler"
        )
        self._consumer = aio.Consumer(
            target,
            stream,
            group,
            self._run_handler if handler is not None else None,
            start=start,
            max_in_flight=max_in_flight,
            concurrency=concurrency,
            max_batch=max_batch,
            ack_linger=ack_linger,
            ack_deadline=ack_deadline,
            retry_backoff_initial=retry_backoff_initial,
            retry_backoff_max=retry_backoff_max,
            dead_letter_stream=dead_letter_stream,
            max_deliveries=max_deliveries,
            no_ack=no_ack,
            reconnect=reconnect,
            on_verdict_error=on_verdict_error,
            channel_options=channel_options,
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


