"""Client behaviours beyond the shared scenarios, against the real sidecar."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import pytest
import redis

import echomq
from echomq import Backoff, Consumer, Delivery, PermanentError, Producer, Start, VerdictError
from echomq import sync as echomq_sync
from echomq.v1 import consumer_service_pb2 as pb
from support import AckCounter, RedisServer, Sidecar

FAST = Backoff(initial=0.05, maximum=0.5)


async def until(what: str, predicate: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def pending(client: redis.Redis, stream: str, group: str) -> int:
    return int(client.xpending(stream, group)["pending"])


async def test_append_returns_branded_ids_in_stream_order(live_sidecar: Sidecar) -> None:
    async with Producer(live_sidecar.target) as producer:
        one = await producer.append("py:append", {"n": "0"})
        batch = await producer.append_batch("py:append", [{"n": b"1"}, {"n": b"2"}], max_len=1000)
    ids = [one.id] + [a.id for a in batch]
    assert all(echomq.is_branded_id(i) for i in ids) and ids == sorted(ids) and len(set(ids)) == 3
    for appended in [one, *batch]:
        ms, seq = appended.stream_id.split("-")
        assert appended.id == f"{int(ms):012x}{int(seq):016x}"


async def test_a_dedup_key_makes_a_retried_append_answer_the_first_one(
    live_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    stream = "py:dedup"
    redis_client.delete(stream)
    async with Producer(live_sidecar.target) as producer:
        first = await producer.append(stream, {"n": "1"}, dedup_key="order-1")
        retried = await producer.append(stream, {"n": "1, again"}, dedup_key="order-1")
        plain = [await producer.append(stream, {"n": "2"}, dedup_key=k) for k in (None, "", None)]
    assert not first.duplicate and retried.duplicate
    assert (retried.id, retried.stream_id, retried.stream) == (first.id, first.stream_id, first.stream)
    assert not any(a.duplicate for a in plain) and len({a.id for a in plain}) == 3
    assert redis_client.xlen(stream) == 4
    assert redis_client.xrange(stream, count=1)[0][1][b"n"] == b"1"


async def test_batch_entries_carry_their_own_dedup_keys(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    stream = "py:dedup-batch"
    redis_client.delete(stream)
    async with Producer(live_sidecar.target) as producer:
        single = await producer.append(stream, {"n": "0"}, dedup_key="k0")
        batch = await producer.append_batch(
            stream,
            [
                echomq.BatchEntry({"n": "1"}, dedup_key="k1"),
                echomq.BatchEntry({"n": "1"}, dedup_key="k1"),
                echomq.BatchEntry({"n": "0"}, dedup_key="k0"),
                {"n": "2"},
                echomq.BatchEntry({"n": "3"}),
            ],
        )
        again = await producer.append_batch(stream, [echomq.BatchEntry({"n": "1"}, dedup_key="k1")])
    assert [a.duplicate for a in batch] == [False, True, True, False, False]
    assert batch[1][:3] == batch[0][:3] and batch[2][:3] == single[:3] and again[0][:3] == batch[0][:3]
    assert again[0].duplicate
    assert redis_client.xlen(stream) == 4


async def test_a_dedup_key_over_max_name_bytes_is_refused_and_writes_nothing(
    live_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    stream = "py:dedup-long"
    redis_client.delete(stream)
    async with Producer(live_sidecar.target) as producer:
        with pytest.raises(PermanentError) as refused:
            await producer.append(stream, {"n": "1"}, dedup_key="k" * 1025)
        with pytest.raises(PermanentError):
            await producer.append_batch(stream, [echomq.BatchEntry({"n": "1"}, dedup_key="k" * 1025)])
        fits = await producer.append(stream, {"n": "1"}, dedup_key="k" * 1024)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and "dedup" in refused.value.details
    assert not fits.duplicate and redis_client.xlen(stream) == 1


def test_the_sync_producer_sends_dedup_keys(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    stream = "py:dedup-sync"
    redis_client.delete(stream)
    with echomq_sync.Producer(live_sidecar.target) as producer:
        first = producer.append(stream, {"n": "1"}, dedup_key="s1")
        retried = producer.append(stream, {"n": "1"}, dedup_key="s1")
        batch = producer.append_batch(stream, [echomq.BatchEntry({"n": "1"}, dedup_key="s1"), {"n": "2"}])
    assert retried.duplicate and retried.id == first.id
    assert [a.duplicate for a in batch] == [True, False] and batch[0].id == first.id
    assert redis_client.xlen(stream) == 2


async def test_a_reserved_field_is_refused_permanently(live_sidecar: Sidecar) -> None:
    async with Producer(live_sidecar.target) as producer:
        with pytest.raises(PermanentError) as refused:
            await producer.append("py:reserved", {"id": b"mine"})
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_bad_subscribe_is_raised_not_retried(live_sidecar: Sidecar) -> None:
    consumer = Consumer(live_sidecar.target, "py:bad", "g", _ack, start=Start.NEW, max_in_flight=100_000)
    await consumer.start()
    with pytest.raises(PermanentError) as refused:
        await consumer.wait_subscribed(10)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and "max_in_flight" in refused.value.details
    with pytest.raises(PermanentError):
        await consumer.wait()
    await consumer.stop()


async def test_a_key_of_another_type_is_failed_precondition(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    redis_client.set("py:wrongtype", "a string")
    consumer = Consumer(live_sidecar.target, "py:wrongtype", "g", _ack, start=Start.BEGINNING)
    with pytest.raises(PermanentError) as refused:
        await consumer.run()
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    await consumer.stop()


async def test_non_utf8_field_names_arrive_as_raw_fields(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    stream = "py:raw"
    redis_client.xadd(stream, {b"\xffname": b"v1", b"ok": b"v2"})
    got: list[Delivery] = []

    async def handle(delivery: Delivery) -> None:
        got.append(delivery)

    async with Consumer(live_sidecar.target, stream, "g", handle, start=Start.BEGINNING):
        await until("a delivery", lambda: got)
    [delivery] = got
    assert delivery.payload == {"ok": b"v2"} and delivery.raw_fields == [(b"\xffname", b"v1")]
    assert echomq.is_branded_id(delivery.id) and delivery.attempts == 1


async def test_max_deliveries_dead_letters_a_poison_entry(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    stream = "py:poison"
    attempts: list[int] = []

    async def always_fails(delivery: Delivery) -> None:
        attempts.append(delivery.attempts)
        raise ValueError("cannot parse")

    async with Producer(live_sidecar.target) as producer:
        await producer.append(stream, {"body": b"?"})
    async with Consumer(
        live_sidecar.target, stream, "g", always_fails, start=Start.BEGINNING, max_deliveries=2, retry_backoff_initial=0.05
    ):
        await until("the dead letter", lambda: redis_client.xlen(f"{stream}:dlq") == 1)
    assert attempts == [1, 2] and pending(redis_client, stream, "g") == 0


async def test_stop_cancels_handlers_past_the_deadline(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    stream = "py:slow"
    started = asyncio.Event()

    async def slow(delivery: Delivery) -> None:
        started.set()
        await asyncio.sleep(30)

    async with Producer(live_sidecar.target) as producer:
        await producer.append(stream, {"n": b"1"})
    consumer = Consumer(live_sidecar.target, stream, "g", slow, start=Start.BEGINNING)
    await consumer.start()
    await asyncio.wait_for(started.wait(), 20)
    began = time.monotonic()
    await consumer.stop(0.3)
    assert time.monotonic() - began < 2.0
    assert pending(redis_client, stream, "g") == 1  # not acked: it will come back


class FrameLog(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    """Records the kind of every client message the consumer sends, in order."""

    def __init__(self) -> None:
        self.kinds: list[str] = []

    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        async def logged() -> AsyncIterator[pb.ConsumeRequest]:
            async for request in request_iterator:
                self.kinds.append(str(request.WhichOneof("kind")))
                yield request

        return await continuation(client_call_details, logged())


async def test_stop_drains_first_so_the_freed_credit_reads_nothing_more(
    live_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    # Without a Drain, the credit the last ack frees pulls the second entry into
    # the PEL (XREADGROUP >) just before the call closes: it stays pending,
    # never handed to a handler.
    stream, group = "py:drain", "g"
    redis_client.delete(stream)
    first, *rest = [redis_client.xadd(stream, {"n": str(i)}).decode() for i in range(3)]
    calls: list[str] = []
    started = asyncio.Event()

    async def slow(delivery: Delivery) -> None:
        calls.append(delivery.stream_id)
        started.set()
        await asyncio.sleep(0.3)

    frames = FrameLog()
    consumer = Consumer(
        live_sidecar.target, stream, group, slow, start=Start.BEGINNING, max_in_flight=1, interceptors=[frames]
    )
    await consumer.start()
    await asyncio.wait_for(started.wait(), 20)
    await consumer.stop(5)
    await consumer.wait()
    await asyncio.sleep(0.3)  # a read the last ack would have started has landed by now
    assert calls == [first]
    assert frames.kinds == ["subscribe", "drain", "ack"]
    assert pending(redis_client, stream, group) == 0
    [info] = redis_client.xinfo_groups(stream)
    assert info["last-delivered-id"].decode() == first, f"entries after {first} were read: {info}"
    assert info["entries-read"] == 1
    assert redis_client.xlen(stream) == 1 + len(rest)


async def test_verdicts_of_a_broken_call_are_dropped_after_reconnect(
    private_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    stream = "py:stale"
    release = asyncio.Event()
    first: list[Delivery] = []
    handled: list[int] = []
    errors: list[VerdictError] = []
    acks = AckCounter()

    async def handle(delivery: Delivery) -> None:
        if delivery.attempts == 1:
            first.append(delivery)
            await release.wait()  # still running when its call breaks
        handled.append(delivery.attempts)

    async with Producer(private_sidecar.target) as producer:
        appended = await producer.append(stream, {"n": b"1"})
    consumer = Consumer(
        private_sidecar.target, stream, "g", handle, start=Start.BEGINNING, max_in_flight=4,
        reconnect=FAST, on_verdict_error=errors.append, interceptors=[acks],
    )
    await consumer.start()
    await until("the first delivery", lambda: first)
    private_sidecar.kill()
    await until("the broken call", lambda: consumer.subscription is None)
    await asyncio.to_thread(private_sidecar.start)
    await consumer.wait_subscribed(20)
    await until("the redelivery", lambda: 2 in handled)
    release.set()
    await until("the old handler", lambda: len(handled) == 2)
    assert not await first[0].ack()  # the old call is gone: nothing is sent
    await consumer.stop(5)
    assert acks.acks[appended.id] == 1  # only the redelivery's ack travelled
    assert errors == [] and pending(redis_client, stream, "g") == 0


@pytest.fixture
def unix_sidecar(redis_server: RedisServer) -> Iterator[Sidecar]:
    car = Sidecar(redis_server.url, "py-unix", [], unix_socket=True)
    try:
        car.start()
        yield car
    finally:
        car.close()


async def test_a_unix_socket_works_for_both_sides(unix_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    assert unix_sidecar.target.startswith("unix:/")
    got: list[Delivery] = []

    async def handle(delivery: Delivery) -> None:
        got.append(delivery)

    async with Producer(unix_sidecar.target) as producer:
        appended = await producer.append("py:unix", {"via": b"socket"})
    async with Consumer(unix_sidecar.target, "py:unix", "g", handle, start=Start.BEGINNING) as consumer:
        assert (await consumer.wait_subscribed(10)).consumer == "py-unix"
        await until("a delivery", lambda: got)
    assert got[0].id == appended.id and got[0].payload == {"via": b"socket"}


def test_the_sync_facade_round_trips(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    stream = "py:sync"
    with echomq_sync.Producer(live_sidecar.target) as producer:
        appended = [producer.append(stream, {"n": str(i)}) for i in range(3)]
    seen: list[str] = []
    lock = threading.Lock()

    def handle(delivery: echomq_sync.SyncDelivery) -> None:
        with lock:
            seen.append(delivery.id)
        if delivery.payload["n"] == b"2":
            delivery.ack()  # an explicit settle is not repeated

    consumer = echomq_sync.Consumer(live_sidecar.target, stream, "g", handle, start=Start.BEGINNING, max_in_flight=2)
    runner = threading.Thread(target=consumer.run)
    runner.start()
    try:
        assert consumer.wait_subscribed(10).stream == stream
        deadline = time.monotonic() + 20
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        consumer.stop(5)
        runner.join(10)
    assert sorted(seen) == sorted(a.id for a in appended) and not runner.is_alive()
    assert pending(redis_client, stream, "g") == 0


@pytest.fixture
def sharded_sidecar(redis_server: RedisServer) -> Iterator[Sidecar]:
    """A sidecar of its own with `py:sharded` as a sharded stream of 3 shards."""
    car = Sidecar(redis_server.url, "py-sharded", ["--sharded-streams", "py:sharded=3"])
    try:
        car.start()
        yield car
    finally:
        car.close()


async def test_a_partition_key_keeps_its_entries_on_one_shard_in_order(
    sharded_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    stream, group = "py:sharded", "g"
    shards = [f"{stream}:{{{stream}:{k}}}" for k in range(3)]
    async with Producer(sharded_sidecar.target) as producer:
        by_key: dict[str, list[echomq.Appended]] = {"a": [], "b": []}
        for i in range(4):
            for key in by_key:
                by_key[key].append(await producer.append(stream, {"key": key, "n": str(i)}, partition_key=key))
        for key in by_key:
            by_key[key] += await producer.append_batch(
                stream, [{"key": key, "n": str(i)} for i in (4, 5)], partition_key=key
            )
    for key, entries in by_key.items():
        assert len({e.stream for e in entries}) == 1, f"key {key!r} was spread over shards: {entries}"
        assert entries[0].stream in shards
    got: list[Delivery] = []

    async def handle(delivery: Delivery) -> None:
        got.append(delivery)

    # concurrency=1: handlers run one at a time in arrival order, so `got` is
    # the order in which the sidecar handed the entries out.
    async with Consumer(
        sharded_sidecar.target, stream, group, handle, start=Start.BEGINNING, concurrency=1
    ) as consumer:
        subscribed = await consumer.wait_subscribed(10)
        assert subscribed.stream == stream and subscribed.max_in_flight >= 3
        await until("every delivery", lambda: len(got) >= 12)
        await until("every ack", lambda: sum(pending(redis_client, s, group) for s in shards) == 0)
    for key, entries in by_key.items():
        delivered = [d for d in got if d.payload["key"] == key.encode()]
        assert [d.id for d in delivered] == [e.id for e in entries], f"key {key!r} out of order"
        assert {d.stream for d in delivered} == {entries[0].stream}
    assert len(got) == 12 and all(d.attempts == 1 for d in got)


async def test_a_dedup_key_without_partition_key_retries_onto_the_same_shard(sharded_sidecar: Sidecar) -> None:
    stream = "py:sharded"
    async with Producer(sharded_sidecar.target) as producer:
        answers = [await producer.append(stream, {"n": str(i)}, dedup_key="sharded-1") for i in range(4)]
    assert [a.duplicate for a in answers] == [False, True, True, True]
    assert len({(a.id, a.stream) for a in answers}) == 1


async def _ack(delivery: Delivery) -> None:
    pass
