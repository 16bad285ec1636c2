"""Batched frames, coalesced acks, the worker pool and the batch handler,
against the real sidecar and redis-server."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import pytest
import redis

from echomq import Ack, Backoff, Consumer, DeadLetter, Delivery, Fail, PermanentError, Producer, Start, Verdict
from echomq.v1 import consumer_service_pb2 as pb
from support import AckCounter, Sidecar

FAST = Backoff(initial=0.05, maximum=0.5)


async def until(what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def pending(client: redis.Redis, stream: str, group: str = "g") -> int:
    """XPENDING's count; -1 while the group does not exist yet."""
    try:
        return int(client.xpending(stream, group)["pending"])
    except redis.ResponseError:
        return -1


class Wire(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    """Records both directions of the Consume call: the sizes of the delivery
    frames the sidecar sends (a single `Delivery` is 0) and the Ack messages
    the client sends."""

    def __init__(self) -> None:
        self.frames: list[int] = []
        self.subscribes: list[pb.Subscribe] = []
        self.ack_messages: list[list[str]] = []
        self.acked: Counter[str] = Counter()

    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        async def sent() -> AsyncIterator[pb.ConsumeRequest]:
            async for request in request_iterator:
                kind = request.WhichOneof("kind")
                if kind == "subscribe":
                    self.subscribes.append(request.subscribe)
                elif kind == "ack":
                    self.ack_messages.append(list(request.ack.ids))
                    self.acked.update(request.ack.ids)
                yield request

        call = await continuation(client_call_details, sent())

        async def received() -> AsyncIterator[pb.ConsumeResponse]:
            async for response in call:
                kind = response.WhichOneof("kind")
                if kind == "batch":
                    self.frames.append(len(response.batch.deliveries))
                elif kind == "delivery":
                    self.frames.append(0)
                yield response

        return received()


async def append_n(target: str, stream: str, n: int) -> list[str]:
    """Appends n entries (field `n` = index) in batches; returns their branded ids."""
    ids: list[str] = []
    async with Producer(target) as producer:
        for start in range(0, n, 500):
            batch = await producer.append_batch(stream, [{"n": str(i)} for i in range(start, min(n, start + 500))])
            ids += [a.id for a in batch]
    return ids


async def consume_all(
    sidecar: Sidecar, redis_client: redis.Redis, stream: str, n: int, **options: Any
) -> tuple[list[str], list[str], Wire]:
    """Appends n entries, consumes them with a handler that records each id,
    until all are handled and acked; returns (appended ids, handled ids, wire)."""
    redis_client.delete(stream)
    ids = await append_n(sidecar.target, stream, n)
    seen: list[str] = []

    async def handle(delivery: Delivery) -> None:
        seen.append(delivery.id)

    wire = Wire()
    async with Consumer(sidecar.target, stream, "g", handle, start=Start.BEGINNING, interceptors=[wire], **options):
        await until("every delivery", lambda: len(seen) == n)
        await until("every ack applied", lambda: pending(redis_client, stream) == 0)
    return ids, seen, wire


async def test_batches_arrive_and_each_delivery_is_settled(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    ids, seen, wire = await consume_all(live_sidecar, redis_client, "py:batch:frames", 600, max_in_flight=512)
    assert [s.max_batch for s in wire.subscribes] == [256]
    assert 0 not in wire.frames, "a call that asks for batches gets only DeliveryBatch frames"
    assert max(wire.frames) > 1 and max(wire.frames) <= 256 and sum(wire.frames) == 600
    assert sorted(seen) == sorted(ids) and wire.acked == Counter(ids)


async def test_max_batch_1_gets_single_delivery_frames(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    ids, seen, wire = await consume_all(live_sidecar, redis_client, "py:batch:single", 20, max_batch=1)
    assert wire.frames == [0] * 20 and sorted(seen) == sorted(ids)


async def test_a_max_batch_above_the_limit_is_refused(live_sidecar: Sidecar) -> None:
    consumer = Consumer(live_sidecar.target, "py:batch:big", "g", _ack, start=Start.NEW, max_in_flight=8192, max_batch=5000)
    with pytest.raises(PermanentError) as refused:
        await consumer.run()
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and "max_batch" in refused.value.details
    await consumer.stop()


async def test_one_ack_message_carries_the_acks_of_a_window(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    # One handler, about 1 ms per delivery: one Ack message per delivery unless
    # the acks of a window (50 ms here) are coalesced.
    stream = "py:batch:coalesce"
    redis_client.delete(stream)
    ids = await append_n(live_sidecar.target, stream, 200)

    handled: list[str] = []

    async def handle(delivery: Delivery) -> None:
        await asyncio.sleep(0.001)
        handled.append(delivery.id)

    wire = Wire()
    async with Consumer(
        live_sidecar.target, stream, "g", handle, start=Start.BEGINNING, max_in_flight=256, concurrency=1,
        ack_linger=0.05, interceptors=[wire],
    ):
        await until("every delivery", lambda: len(handled) == 200)
        await until("every ack applied", lambda: pending(redis_client, stream) == 0)
    assert wire.acked == Counter(ids), "each id acked exactly once"
    assert len(wire.ack_messages) <= 40, f"{len(wire.ack_messages)} Ack messages for 200 ids"
    assert max(len(m) for m in wire.ack_messages) > 1


async def test_a_full_window_is_sent_without_waiting_and_stop_flushes_the_rest(
    live_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    # A 60 s window: only the size bound (256 ids) sends acks while a handler
    # runs (the last one is held until the stop), and only the graceful stop
    # can send the last partial window.
    stream = "py:batch:flush"
    redis_client.delete(stream)
    ids = await append_n(live_sidecar.target, stream, 600)
    handled: list[str] = []
    gate = asyncio.Event()

    async def handle(delivery: Delivery) -> None:
        handled.append(delivery.id)
        if len(handled) == 600:
            await gate.wait()

    wire = Wire()
    consumer = Consumer(
        live_sidecar.target, stream, "g", handle, start=Start.BEGINNING, max_in_flight=1024, ack_linger=60,
        interceptors=[wire],
    )
    await consumer.start()
    await until("every delivery handled", lambda: len(handled) == 600)
    await until("two full windows applied", lambda: pending(redis_client, stream) == 600 - 512)
    await asyncio.sleep(0.2)
    assert pending(redis_client, stream) == 88, "the partial window waits for its linger while a handler runs"
    assert [len(m) for m in wire.ack_messages] == [256, 256]
    began = time.monotonic()
    gate.set()  # the last handler returns during the stop
    await consumer.stop(5)
    await consumer.wait()
    assert time.monotonic() - began < 5
    assert pending(redis_client, stream) == 0, "stop sent the coalesced acks before closing the call"
    assert wire.acked == Counter(ids)


async def test_the_last_window_goes_out_once_every_delivery_was_handled(
    live_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    # A 60 s window, and no handler left running: the sidecar may be waiting
    # for this credit, so the partial window goes out at once.
    stream = "py:batch:idleflush"
    redis_client.delete(stream)
    ids = await append_n(live_sidecar.target, stream, 600)
    handled: list[str] = []

    async def handle(delivery: Delivery) -> None:
        handled.append(delivery.id)

    wire = Wire()
    consumer = Consumer(
        live_sidecar.target, stream, "g", handle, start=Start.BEGINNING, max_in_flight=1024, ack_linger=60,
        interceptors=[wire],
    )
    await consumer.start()
    try:
        await until("every delivery handled", lambda: len(handled) == 600)
        await until("every ack applied without the linger", lambda: pending(redis_client, stream) == 0, 10)
        assert wire.acked == Counter(ids)
        assert max(len(m) for m in wire.ack_messages) <= 256
    finally:
        await consumer.stop(5)


async def test_stop_flushes_the_acks_of_handlers_that_finish_during_it(
    live_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    # The Drain goes out before the handler finishes; its ack then joins a 60 s
    # window that only the half-close flushes.
    stream = "py:batch:stopflush"
    redis_client.delete(stream)
    [id] = await append_n(live_sidecar.target, stream, 1)
    started = asyncio.Event()

    async def slow(delivery: Delivery) -> None:
        started.set()
        await asyncio.sleep(0.3)

    wire = Wire()
    consumer = Consumer(
        live_sidecar.target, stream, "g", slow, start=Start.BEGINNING, ack_linger=60, interceptors=[wire]
    )
    await consumer.start()
    await asyncio.wait_for(started.wait(), 20)
    began = time.monotonic()
    await consumer.stop(5)
    assert time.monotonic() - began < 5
    assert wire.ack_messages == [[id]] and pending(redis_client, stream) == 0


async def test_no_task_per_delivery(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    stream = "py:batch:tasks"
    redis_client.delete(stream)
    await append_n(live_sidecar.target, stream, 1000)
    most = 0
    handled = 0

    async def handle(delivery: Delivery) -> None:
        nonlocal most, handled
        most = max(most, len(asyncio.all_tasks()))
        handled += 1
        await asyncio.sleep(0)

    before = len(asyncio.all_tasks())
    async with Consumer(
        live_sidecar.target, stream, "g", handle, start=Start.BEGINNING, max_in_flight=512, concurrency=4
    ):
        await until("every delivery", lambda: handled == 1000)
    # The 4 workers, the consumer's task and gRPC's own few; never one per delivery.
    assert most - before <= 4 + 8, f"{most - before} tasks while 512 deliveries were in flight"


async def test_a_disconnect_redelivers_exactly_the_unacked_entries_of_a_batch(
    live_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    stream = "py:batch:partial"
    redis_client.delete(stream)
    ids = await append_n(live_sidecar.target, stream, 10)
    odd = {ids[i] for i in range(1, 10, 2)}
    first: list[Delivery] = []

    async def acks_even_holds_odd(delivery: Delivery) -> None:
        first.append(delivery)
        if int(delivery.payload["n"]) % 2:
            await asyncio.Event().wait()  # held until the connection drops

    wire = Wire()
    consumer = Consumer(
        live_sidecar.target, stream, "g", acks_even_holds_odd, start=Start.BEGINNING, max_in_flight=10,
        interceptors=[wire],
    )
    await consumer.start()
    await until("the even entries acked", lambda: pending(redis_client, stream) == 5 and len(first) == 10)
    assert wire.frames == [10], "the ten entries came in one frame"
    await consumer.abort()

    again: list[Delivery] = []

    async def record(delivery: Delivery) -> None:
        again.append(delivery)

    async with Consumer(live_sidecar.target, stream, "g", record, start=Start.BEGINNING, reconnect=FAST):
        await until("the redeliveries", lambda: len(again) >= 5)
        await asyncio.sleep(0.3)  # nothing more comes
        await until("their acks applied", lambda: pending(redis_client, stream) == 0)
    assert sorted(d.id for d in again) == sorted(odd) and {d.attempts for d in again} == {2}


async def test_a_broken_calls_coalesced_acks_are_never_sent_on_the_next_call(
    private_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    stream = "py:batch:broken"
    redis_client.delete(stream)
    ids = await append_n(private_sidecar.target, stream, 5)
    attempts: list[int] = []
    errors: list[object] = []
    gate = asyncio.Event()

    async def handle(delivery: Delivery) -> None:
        attempts.append(delivery.attempts)
        if delivery.id == ids[-1] and delivery.attempts == 1:
            await gate.wait()  # a handler still runs: the others' acks keep coalescing

    wire = Wire()
    consumer = Consumer(
        private_sidecar.target, stream, "g", handle, start=Start.BEGINNING, ack_linger=60, reconnect=FAST,
        on_verdict_error=errors.append, interceptors=[wire],
    )
    await consumer.start()
    await until("the first deliveries", lambda: len(attempts) == 5)
    private_sidecar.kill()  # 4 acks are still coalescing
    await until("the broken call", lambda: consumer.subscription is None)
    gate.set()  # its ack is for the broken call: dropped
    await asyncio.to_thread(private_sidecar.start)
    await consumer.wait_subscribed(20)
    await until("the redeliveries", lambda: len(attempts) == 10)
    await consumer.stop(5)
    assert attempts == [1] * 5 + [2] * 5
    assert wire.acked == Counter(ids), "only the second call's acks travelled, once each"
    assert errors == [] and pending(redis_client, stream) == 0


async def test_the_batch_handler_answers_a_verdict_per_delivery(
    live_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    stream = "py:batch:handler"
    redis_client.delete(stream, f"{stream}:dlq")
    ids = await append_n(live_sidecar.target, stream, 100)
    batches: list[list[Delivery]] = []

    async def handle_many(deliveries: list[Delivery]) -> Sequence[Verdict]:
        batches.append(deliveries)
        verdicts: list[Verdict] = []
        for d in deliveries:
            n = int(d.payload["n"])
            if d.attempts > 1 or n % 5 == 0:
                verdicts.append(None if n % 2 else Ack())
            elif n % 5 == 1:
                verdicts.append(Fail("later", retry_after=0.05))
            elif n % 5 == 2:
                verdicts.append(DeadLetter("poison"))
            elif n % 5 == 3:
                verdicts.append(ValueError("bad input"))
            else:
                await d.ack()  # settled by hand: the verdict for it is ignored
                verdicts.append(Fail("never sent"))
        return verdicts

    wire = Wire()
    async with Consumer(
        live_sidecar.target, stream, "g", batch_handler=handle_many, start=Start.BEGINNING, max_in_flight=128,
        retry_backoff_initial=0.05, interceptors=[wire],
    ):
        await until("every delivery", lambda: sum(map(len, batches)) == 140)  # 100, and 40 retries
        await until("every entry settled", lambda: pending(redis_client, stream) == 0)
    handled = Counter(d.id for b in batches for d in b)
    retried = {ids[n] for n in range(100) if n % 5 in (1, 3)}
    assert handled == Counter({i: 2 if i in retried else 1 for i in ids})
    assert redis_client.xlen(f"{stream}:dlq") == 20
    assert max(len(b) for b in batches) > 1, "the handler got lists, not single deliveries"
    assert all(len(b) <= 128 for b in batches)
    assert wire.acked == Counter(i for n, i in enumerate(ids) if n % 5 != 2), "dead letters are not acked by the client"


async def test_a_raising_batch_handler_fails_the_whole_batch(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    stream = "py:batch:raises"
    redis_client.delete(stream)
    ids = await append_n(live_sidecar.target, stream, 8)
    calls: list[list[int]] = []

    async def handle_many(deliveries: list[Delivery]) -> None:
        calls.append([d.attempts for d in deliveries])
        if deliveries[0].attempts == 1:
            raise RuntimeError("database down")
        return None  # acks them all

    async with Consumer(
        live_sidecar.target, stream, "g", batch_handler=handle_many, start=Start.BEGINNING,
        retry_backoff_initial=0.05,
    ):
        await until("every entry acked", lambda: pending(redis_client, stream) == 0 and sum(map(len, calls)) >= 16)
    assert Counter(a for c in calls for a in c) == {1: 8, 2: 8} and len(ids) == 8


async def test_an_unusable_batch_answer_fails_the_batch_and_the_consumer_reads_on(
    live_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    stream = "py:batch:unusable"
    redis_client.delete(stream)
    ids = await append_n(live_sidecar.target, stream, 6)
    seen: dict[str, list[int]] = {}

    async def handle_many(deliveries: list[Delivery]) -> Any:
        for d in deliveries:
            seen.setdefault(d.id, []).append(d.attempts)
        if all(d.attempts > 1 for d in deliveries):
            return (None for _ in deliveries)  # any iterable of verdicts will do
        if int(deliveries[0].payload["n"]) % 2:
            return 42  # not verdicts at all
        return [Fail("never", retry_after=float("inf"))] * len(deliveries)  # no Duration holds it

    def settled(n: int) -> bool:
        return len(seen) == n and pending(redis_client, stream) == 0

    async with Consumer(
        live_sidecar.target, stream, "g", batch_handler=handle_many, start=Start.BEGINNING, max_in_flight=4,
        max_batch=2, retry_backoff_initial=0.05,
    ):
        await until("the first entries settled", lambda: settled(6))
        ids += await append_n(live_sidecar.target, stream, 2)  # the worker is alive: later entries are handled too
        await until("the later entries settled", lambda: settled(8))
    assert set(seen) == set(ids)
    assert all(attempts[0] == 1 and attempts[-1] > 1 for attempts in seen.values()), seen


async def _ack(delivery: Delivery) -> None:
    pass
