"""AckEmit (consume → produce, exactly once) beyond the shared scenarios,
against the real sidecar: the refusals a handler can meet."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
import redis

from echomq import sync as echomq_sync
from echomq import AckEmitError, Consumer, Delivery, Emit, EmittedEntry, Start, Streams, VerdictError, VerdictErrorCode
from support import AckCounter, RedisServer, Sidecar, run_sync_consumer


@pytest.fixture
def allow_listed_sidecar(redis_server: RedisServer) -> Iterator[Sidecar]:
    """A sidecar of its own that allows only `pyemit:*` streams, with the
    default lease timings (a lease refresh every 10 s: slower than a test)."""
    car = Sidecar(redis_server.url, "py-emit", ["--allow-streams", "pyemit:*"])
    try:
        car.start()
        yield car
    finally:
        car.close()


async def until(what: str, predicate: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_an_emit_outside_the_allow_list_is_refused_and_the_delivery_can_be_answered_again(
    allow_listed_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    source, sink, group = "pyemit:denied:src", "pyemit:denied:sink", "g"
    redis_client.delete(source, sink, "other:sink")
    async with Streams(allow_listed_sidecar.target) as streams:
        appended = await streams.append(source, {"n": "1"})
    refusals: list[AckEmitError] = []
    emitted: list[EmittedEntry] = []
    hooked: list[VerdictError] = []

    async def handle(delivery: Delivery) -> None:
        try:
            await delivery.ack_emit([Emit("other:sink", {"source": delivery.id})])
        except AckEmitError as refused:
            refusals.append(refused)
            assert not delivery.settled, "a bad emit leaves the delivery unsettled"
        # Answered again, on the same delivery: still held.
        emitted.extend(await delivery.ack_emit([(sink, {"source": delivery.id})]))

    async with Consumer(
        allow_listed_sidecar.target, source, group, handle, start=Start.BEGINNING, on_verdict_error=hooked.append
    ):
        await until("the second ack_emit", lambda: len(emitted) == 1)

    [refused] = refusals
    assert refused.code is VerdictErrorCode.PERMISSION_DENIED and refused.held
    assert [e.code for e in hooked] == [VerdictErrorCode.PERMISSION_DENIED]
    assert redis_client.xlen("other:sink") == 0, "nothing written by the refused AckEmit"
    [(stream_id, fields)] = redis_client.xrange(sink)
    assert emitted == [EmittedEntry(fields[b"id"].decode(), stream_id.decode(), sink)]
    assert fields[b"source"] == appended.id.encode()
    assert int(redis_client.xpending(source, group)["pending"]) == 0


async def test_an_entry_a_peer_took_gets_no_emits_and_no_verdict(
    allow_listed_sidecar: Sidecar, redis_client: redis.Redis
) -> None:
    source, sink, group = "pyemit:stolen:src", "pyemit:stolen:sink", "g"
    redis_client.delete(source, sink)
    async with Streams(allow_listed_sidecar.target) as streams:
        await streams.append(source, {"n": "1"})
    started, stolen = asyncio.Event(), asyncio.Event()
    outcome: list[AckEmitError] = []
    wire = AckCounter()
    handled: list[Delivery] = []

    async def handle(delivery: Delivery) -> None:
        handled.append(delivery)
        started.set()
        await stolen.wait()
        try:
            await delivery.ack_emit([Emit(sink, {"source": delivery.id})])
        except AckEmitError as refused:
            outcome.append(refused)
            raise

    consumer = Consumer(
        allow_listed_sidecar.target, source, group, handle, start=Start.BEGINNING, interceptors=[wire]
    )
    async with consumer:
        await asyncio.wait_for(started.wait(), 20)
        [delivery] = handled
        redis_client.xclaim(source, group, "thief", 0, [delivery.stream_id])  # a peer takes it
        stolen.set()
        await until("the refusal", lambda: len(outcome) == 1)

    [refused] = outcome
    # The sidecar's lease refresh may notice the steal before the handler answers: then the call
    # was told LEASE_LOST first and the AckEmit is never sent.
    told_first = refused.code is None
    if told_first:
        assert "not sent: the lease was lost" in str(refused)
    else:
        assert refused.code is VerdictErrorCode.LEASE_LOST
    assert not refused.held
    assert delivery.settled, "a refusal other than a bad emit settles the delivery"
    assert redis_client.xlen(sink) == 0, "a call that lost its entry never writes its emits"
    assert sum(wire.ack_emits.values()) == (0 if told_first else 1) and not wire.acks, "at most one AckEmit, no Ack"
    assert wire.fails == 0, "no Fail follows the refusal: the entry is the peer's"
    [(_, owner, _, _)] = [
        (e["message_id"], e["consumer"], e["time_since_delivered"], e["times_delivered"])
        for e in redis_client.xpending_range(source, group, "-", "+", 10)
    ]
    assert owner == b"thief"


async def test_the_docs_pipeline_prices_each_order_once(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    """docs/src/pipelines.md's Python pipeline (tests/docs_pipeline.py), run as the page shows it."""
    from docs_pipeline import pricing

    redis_client.delete("{orders}:placed", "{orders}:priced")
    orders = [
        {"id": "A-1", "lines": [{"qty": 2, "cents": 150}]},
        {"id": "A-2", "lines": [{"qty": 1, "cents": 999}, {"qty": 3, "cents": 1}]},
        {"id": "A-3", "lines": []},
    ]
    async with Streams(live_sidecar.target) as streams:
        placed = [(await streams.append("{orders}:placed", {"order": json.dumps(o)})).id for o in orders]
    async with pricing(live_sidecar.target):
        await until("the priced orders", lambda: redis_client.xlen("{orders}:priced") == len(orders))

    priced = {f[b"source"].decode(): (f[b"order"].decode(), int(f[b"total_cents"])) for _, f in redis_client.xrange("{orders}:priced")}
    assert priced == {placed[0]: ("A-1", 300), placed[1]: ("A-2", 1002), placed[2]: ("A-3", 0)}
    assert redis_client.xlen("{orders}:priced") == len(orders), "each order priced once"
    assert int(redis_client.xpending("{orders}:placed", "pricing")["pending"]) == 0


def test_the_blocking_consumer_acks_with_emits(live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    """`echomq.sync`: a blocking handler's `ack_emit` waits for the answer and returns the entries."""
    source, sink = "py:emit:sync", "py:emit:sync:sink"
    redis_client.delete(source, sink)
    with echomq_sync.Streams(live_sidecar.target) as streams:
        appended = [streams.append(source, {"n": str(i)}) for i in range(3)]
    emitted: list[EmittedEntry] = []

    def handle(delivery: echomq_sync.SyncDelivery) -> None:
        emitted.extend(delivery.ack_emit([Emit(sink, {"source": delivery.id})]))

    consumer = echomq_sync.Consumer(live_sidecar.target, source, "g", handle, start=Start.BEGINNING)
    run_sync_consumer(consumer, lambda: len(emitted) >= 3)
    sink_entries = {(f[b"id"].decode(), i.decode(), f[b"source"].decode()) for i, f in redis_client.xrange(sink)}
    assert {(e.id, e.stream_id, e.stream) for e in emitted} == {(i, s, sink) for i, s, _ in sink_entries}
    assert {src for _, _, src in sink_entries} == {a.id for a in appended} and len(sink_entries) == 3
    assert int(redis_client.xpending(source, "g")["pending"]) == 0
