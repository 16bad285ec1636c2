"""The client surface of clients/CONTRACT.md ("Surface"): one `Streams` type
that appends, reads and trims; flow settings grouped in `FlowControl`; the
blocking API derived from the asyncio one; and the old names (`Producer`,
`Appended`, `Trimmed`, the flat `max_in_flight=` …) still working, with a
`DeprecationWarning`, for a release."""

from __future__ import annotations

import asyncio
import gc
import inspect
import threading
import time
import warnings

import pytest
import redis

import echomq
from echomq import BatchEntry, Consumer, Delivery, FlowControl, Start, Streams
from echomq import sync as echomq_sync
from support import Sidecar


def pending(client: redis.Redis, stream: str, group: str) -> int:
    return int(client.xpending(stream, group)["pending"])


async def test_one_streams_type_appends_reads_and_trims(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    stream = "py:surface:streams"
    redis_client.delete(stream)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the new names warn about nothing
        async with Streams(live_sidecar.target) as streams:
            one = await streams.append(stream, {"n": "0"}, dedup_key="k0")
            batch = await streams.append_batch(stream, [BatchEntry({"n": "1"}, dedup_key="k1"), {"n": "2"}])
            page = await streams.read(stream)
            trimmed = await streams.trim(stream, max_len=1, ignore_groups=True)
    assert [e.id for e in page.entries] == [one.id] + [a.id for a in batch]
    assert trimmed.trimmed == 2 and redis_client.xlen(stream) == 1


async def test_flow_control_reaches_the_sidecar(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    stream = "py:surface:flow"
    redis_client.delete(stream)
    async with Streams(live_sidecar.target) as streams:
        await streams.append_batch(stream, [{"n": str(i)} for i in range(6)])
    started = asyncio.Event()
    release = asyncio.Event()
    running = 0
    most = 0
    handled = 0

    async def handle(delivery: Delivery) -> None:
        nonlocal running, most, handled
        running += 1
        most = max(most, running)
        started.set()
        await release.wait()
        running -= 1
        handled += 1

    flow = FlowControl(max_in_flight=3, concurrency=2, max_batch=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        consumer = Consumer(live_sidecar.target, stream, "g", handle, start=Start.BEGINNING, flow_control=flow)
    assert consumer.flow_control == flow and consumer.max_batch == 2 and consumer.concurrency == 2
    async with consumer:
        assert (await consumer.wait_subscribed(10)).max_in_flight == 3
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.sleep(0.3)
        assert most == 2  # concurrency
        assert pending(redis_client, stream, "g") == 3  # max_in_flight
        release.set()
        deadline = time.monotonic() + 20
        while handled < 6 or pending(redis_client, stream, "g"):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)


def test_flow_control_and_the_flat_keywords_do_not_mix() -> None:
    async def noop(delivery: Delivery) -> None:
        pass

    with pytest.raises(TypeError, match="not both"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        Consumer("127.0.0.1:1", "s", "g", noop, start=Start.NEW, flow_control=FlowControl(), max_in_flight=2)


async def test_the_deprecated_names_still_work_and_warn(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    stream = "py:surface:deprecated"
    redis_client.delete(stream)
    with pytest.warns(DeprecationWarning, match=r"echomq\.Producer is deprecated.*echomq\.Streams"):
        producer = echomq.Producer(live_sidecar.target)
    async with producer:
        assert isinstance(producer, Streams)
        appended = await producer.append(stream, {"n": "0"})
        assert (await producer.read(stream)).entries[0].id == appended.id
    with pytest.warns(DeprecationWarning, match=r"echomq\.producer\.Producer is deprecated.*echomq\.Streams"):
        from echomq.producer import Producer as from_the_old_module
    assert from_the_old_module is echomq.Producer
    with pytest.warns(DeprecationWarning, match=r"echomq\.Appended is deprecated.*echomq\.AppendResult"):
        assert echomq.Appended is echomq.AppendResult  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match=r"echomq\.Trimmed is deprecated.*echomq\.TrimResult"):
        from echomq import Trimmed  # type: ignore[attr-defined]
    assert Trimmed is echomq.TrimResult

    async def noop(delivery: Delivery) -> None:
        pass

    with pytest.warns(DeprecationWarning, match=r"flow_control=FlowControl\(max_in_flight=, max_batch="):
        consumer = Consumer("127.0.0.1:1", "s", "g", noop, start=Start.NEW, max_in_flight=4, max_batch=2)
    assert consumer.flow_control == FlowControl(max_in_flight=4, max_batch=2) and consumer.max_batch == 2

    with pytest.warns(DeprecationWarning, match=r"echomq\.sync\.Producer is deprecated.*echomq\.sync\.Streams"):
        blocking = echomq_sync.Producer(live_sidecar.target)
    with blocking:
        assert isinstance(blocking, echomq_sync.Streams)
        assert blocking.append(stream, {"n": "1"}).stream_id


def test_the_sync_api_is_derived_from_the_asyncio_one() -> None:
    pairs = [
        (echomq_sync.Streams, echomq.Streams, ["append", "append_batch", "read", "read_pages", "read_all", "trim"]),
        (echomq_sync.Admin, echomq.Admin, ["describe_group", "list_dead_letters", "dead_letters", "replay_dead_letters"]),
        (echomq_sync.SyncDelivery, echomq.Delivery, ["ack", "fail", "dead_letter", "extend"]),
    ]
    for blocking, asyncio_class, names in pairs:
        for name in names:
            ours, theirs = getattr(blocking, name), getattr(asyncio_class, name)
            assert ours.__doc__ == theirs.__doc__, name
            mine, its = inspect.signature(ours), inspect.signature(theirs)
            assert mine.parameters == its.parameters, name
            assert not inspect.iscoroutinefunction(ours), name
    assert inspect.signature(echomq_sync.Streams.read_all).return_annotation == "Iterator[Entry]"
    consumer = inspect.signature(echomq_sync.Consumer).parameters
    asyncio_consumer = inspect.signature(echomq.Consumer).parameters
    assert set(consumer) == (set(asyncio_consumer) - {"batch_handler", "interceptors"}) | {"stop_deadline"}


def test_the_sync_streams_run_on_a_loop_of_their_own(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    stream = "py:surface:sync"
    redis_client.delete(stream)
    with echomq_sync.Streams(live_sidecar.target, timeout=5) as streams:
        ids = [a.id for a in streams.append_batch(stream, [{"n": str(i)} for i in range(5)])]
        assert [e.id for e in streams.read_all(stream, page_size=2)] == ids
        pages = streams.read_pages(stream, page_size=2)
        assert len(next(pages).entries) == 2
        pages.close()  # closes the async iterator on the loop
        assert streams.trim(stream, max_len=2, ignore_groups=True).trimmed == 3
        with pytest.raises(echomq.PermanentError):
            streams.append(stream, {"id": b"reserved"})
    assert not [t for t in threading.enumerate() if t.name == "echomq-sync"]  # the loop thread ended with it
    with pytest.raises(TypeError, match="target"):
        echomq_sync.Streams(object())  # type: ignore[arg-type]
    dropped = echomq_sync.Admin(live_sidecar.target)
    del dropped  # never closed: its channel is closed and its thread ends all the same
    gc.collect()
    assert not [t for t in threading.enumerate() if t.name == "echomq-sync"]
