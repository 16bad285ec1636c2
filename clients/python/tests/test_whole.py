"""The whole client (clients/CONTRACT.md, "Whole clients"), against the real
sidecar and Redis: Read and Trim, the AdminService, the `async for` form,
every subscription setting reaching the sidecar, LEASE_LOST and the
permanent codes. Each test names the behaviour it pins down."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timedelta, timezone

from typing import Any

import grpc
import pytest
import redis

from echomq import (
    Admin,
    BusyKey,
    Consumer,
    Delivery,
    FailKind,
    FlowControl,
    PermanentError,
    PoisonError,
    Start,
    Streams,
    TransientError,
    VerdictError,
    VerdictErrorCode,
    is_branded_id,
)
from echomq import sync as echomq_sync
from echomq.consumer import DEFAULT_CONCURRENCY, DEFAULT_MAX_IN_FLIGHT
from support import RedisServer, Sidecar, run_sync_consumer


async def until(what: str, predicate: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def pending(client: redis.Redis, stream: str, group: str) -> int:
    return int(client.xpending(stream, group)["pending"])


@pytest.fixture
def fresh(redis_client: redis.Redis, request: pytest.FixtureRequest) -> str:
    """A stream named after the test, with its dead-letter stream, deleted first."""
    stream = f"py:whole:{request.node.name}"
    redis_client.delete(stream, f"{stream}:dlq")
    return stream


# -- Read ------------------------------------------------------------------------


async def test_read_pages_follow_next_start_id_to_the_end(live_sidecar: Sidecar, fresh: str) -> None:
    async with Streams(live_sidecar.target) as streams:
        appended = await streams.append_batch(fresh, [{"n": str(i)} for i in range(25)])
        first = await streams.read(fresh, count=10)
        pages = [page async for page in streams.read_pages(fresh, page_size=10)]
        every = [entry async for entry in streams.read_all(fresh, page_size=7)]
    assert [e.stream_id for e in first.entries] == [a.stream_id for a in appended[:10]]
    assert first.next_start_id is not None
    assert [len(p.entries) for p in pages] == [10, 10, 5] and pages[-1].next_start_id is None
    assert [e.id for e in every] == [a.id for a in appended]
    assert every[3].payload == {"n": b"3"} and is_branded_id(every[3].id)
    assert every[0].minted_at.tzinfo is not None


async def test_read_by_instant_and_by_id_bounds(live_sidecar: Sidecar, fresh: str) -> None:
    async with Streams(live_sidecar.target) as streams:
        before = await streams.append_batch(fresh, [{"n": "old"}] * 3)
        await asyncio.sleep(0.02)
        instant = datetime.now(timezone.utc)
        await asyncio.sleep(0.02)
        after = await streams.append_batch(fresh, [{"n": "new"}] * 2)
        since = [e.stream_id async for e in streams.read_all(fresh, start=instant)]
        until_ = await streams.read(fresh, end=instant)
        middle = await streams.read(fresh, start=before[1].stream_id, end=after[0].stream_id)
        missing = await streams.read("py:whole:no-such-stream")
    assert since == [a.stream_id for a in after]
    assert [e.stream_id for e in until_.entries] == [b.stream_id for b in before]
    assert [e.stream_id for e in middle.entries] == [before[1].stream_id, before[2].stream_id, after[0].stream_id]
    assert missing.entries == [] and missing.next_start_id is None


async def test_read_refuses_a_bad_id_permanently(live_sidecar: Sidecar, fresh: str) -> None:
    async with Streams(live_sidecar.target) as streams:
        with pytest.raises(PermanentError) as refused:
            await streams.read(fresh, start="not-an-id")
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(ValueError):
        await Streams(live_sidecar.target).read(fresh, count=10_001)


# -- Trim ------------------------------------------------------------------------


async def test_trim_spares_what_a_group_has_not_read_unless_told(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    async with Streams(live_sidecar.target) as streams:
        await streams.append_batch(fresh, [{"n": str(i)} for i in range(10)])
        redis_client.xgroup_create(fresh, "unread", id="0")  # has read nothing yet
        safe = await streams.trim(fresh, max_len=2)
        assert safe.held_back_by_groups and safe.trimmed == 0 and redis_client.xlen(fresh) == 10
        forced = await streams.trim(fresh, max_len=2, ignore_groups=True)
    assert forced.trimmed == 8 and redis_client.xlen(fresh) == 2 and forced.applied_min_id is not None


async def test_trim_by_instant_and_by_id(live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str) -> None:
    async with Streams(live_sidecar.target) as streams:
        old = await streams.append_batch(fresh, [{"n": "old"}] * 3)
        await asyncio.sleep(0.02)
        instant = datetime.now(timezone.utc)
        await asyncio.sleep(0.02)
        new = await streams.append_batch(fresh, [{"n": "new"}] * 3)
        by_time = await streams.trim(fresh, before=instant)
        assert by_time.trimmed == 3 and not by_time.held_back_by_groups
        by_id = await streams.trim(fresh, min_id=new[2].stream_id)
    assert by_id.trimmed == 2 and [e[0].decode() for e in redis_client.xrange(fresh)] == [new[2].stream_id]
    assert old  # appended
    with pytest.raises(ValueError):
        await Streams(live_sidecar.target).trim(fresh, max_len=1, min_id="1-0")  # exactly one bound


# -- Admin -----------------------------------------------------------------------


async def test_describe_group_reports_pending_consumers_and_length(
    live_sidecar: Sidecar, fresh: str
) -> None:
    async with Streams(live_sidecar.target) as streams:
        appended = await streams.append_batch(fresh, [{"n": "1"}, {"n": "2"}])
    async with Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING, max_in_flight=2) as consumer:
        got: list[Delivery] = []
        async for delivery in consumer:
            got.append(delivery)
            if len(got) == 2:
                break
        await got[0].ack()
        name = (await consumer.wait_subscribed(10)).consumer
        async with Admin(live_sidecar.target) as admin:
            deadline = time.monotonic() + 10
            while (info := await admin.describe_group(fresh, "g")).pending != 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
    assert info.stream == fresh and info.group == "g" and info.pending == 1 and info.stream_length == 2
    assert info.oldest_pending_id == appended[1].stream_id and info.max_delivery_count == 1
    assert info.oldest_pending_age is not None and info.oldest_pending_age >= timedelta(0)
    assert info.last_delivered_id == appended[1].stream_id and info.lag == 0
    [me] = [c for c in info.consumers if c.name == name]
    assert me.pending == 1 and isinstance(me.idle, timedelta)


async def test_describe_group_reports_busy_keys_with_per_key_limits(live_sidecar: Sidecar, fresh: str) -> None:
    async with Streams(live_sidecar.target) as streams:
        appended = await streams.append_batch(fresh, [{"customer": key} for key in ("c0", "c0", "c1", "c0")])
    release = asyncio.Event()

    async def hold(delivery: Delivery) -> None:
        await release.wait()

    async with Consumer(
        live_sidecar.target, fresh, "g", hold, start=Start.BEGINNING,
        flow_control=FlowControl(max_in_flight=8), key_field="customer", max_in_flight_per_key=1,
    ) as consumer:
        name = (await consumer.wait_subscribed(10)).consumer
        async with Admin(live_sidecar.target) as admin:
            deadline = time.monotonic() + 10
            while (info := await admin.describe_group(fresh, "g")).keyed_entries != 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        release.set()
    assert info.keyed_entries == 4, info
    assert info.busy_keys == [
        BusyKey(b"c0", 3, appended[0].stream_id, name),
        BusyKey(b"c1", 1, appended[2].stream_id, name),
    ], info.busy_keys


async def test_describe_of_a_missing_group_is_not_found_and_permanent(live_sidecar: Sidecar, fresh: str) -> None:
    async with Admin(live_sidecar.target) as admin:
        with pytest.raises(PermanentError) as refused:
            await admin.describe_group(fresh, "nobody")
    assert refused.value.code == grpc.StatusCode.NOT_FOUND and refused.value.permanent


async def _dead_letter_all(sidecar: Sidecar, stream: str, count: int, reason: str) -> list[Delivery]:
    """Appends `count` entries and dead-letters each from an iterated consumer."""
    async with Streams(sidecar.target) as streams:
        await streams.append_batch(stream, [{"n": str(i)} for i in range(count)])
    handled: list[Delivery] = []
    async with Consumer(sidecar.target, stream, "g", start=Start.BEGINNING) as consumer:
        async for delivery in consumer:
            assert await delivery.dead_letter(reason)
            handled.append(delivery)
            if len(handled) == count:
                break
    return handled


async def test_dead_letters_are_listed_page_by_page_and_replayed(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    handled = await _dead_letter_all(live_sidecar, fresh, 3, "cannot parse")
    await until("three dead letters", lambda: redis_client.xlen(f"{fresh}:dlq") == 3)
    async with Admin(live_sidecar.target) as admin:
        page = await admin.list_dead_letters(fresh, count=2)
        assert len(page.dead_letters) == 2 and page.next_start_id is not None
        every = [d async for d in admin.dead_letters(fresh, page_size=2)]
        assert [d.entry.id for d in every] == [d.id for d in handled]
        first = every[0]
        assert first.reason == "cannot parse" and first.group == "g" and first.source_stream == fresh
        assert first.source_id == handled[0].stream_id and first.attempts == 1
        assert first.entry.payload == {"n": b"0"} and first.dead_lettered_at.tzinfo is not None

        one = await admin.replay_dead_letters(fresh, ids=[first.entry.stream_id, "1-1"])
        assert [r.id for r in one.replayed] == [first.entry.id] and one.not_found_ids == ["1-1"]
        assert redis_client.xlen(f"{fresh}:dlq") == 2
        rest = await admin.replay_dead_letters(fresh)
        assert [r.id for r in rest.replayed] == [d.entry.id for d in every[1:]]
        assert [d async for d in admin.dead_letters(fresh)] == []
    async with Streams(live_sidecar.target) as streams:
        back = [e async for e in streams.read_all(fresh)]
    # The replays are new entries of the source stream with their old branded ids.
    assert [e.id for e in back[3:]] == [d.id for d in handled]
    assert back[3].stream_id == one.replayed[0].stream_id


async def test_replay_to_a_stream_without_groups_is_refused_permanently(live_sidecar: Sidecar, fresh: str) -> None:
    async with Admin(live_sidecar.target) as admin:
        with pytest.raises(PermanentError) as refused:
            await admin.replay_dead_letters(fresh, dead_letter_stream=fresh)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_the_sync_streams_and_admin_read_trim_and_describe(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    with echomq_sync.Streams(live_sidecar.target) as streams:
        appended = streams.append_batch(fresh, [{"n": str(i)} for i in range(5)])
        assert [e.id for e in streams.read_all(fresh, page_size=2)] == [a.id for a in appended]
        assert len(list(streams.read_pages(fresh, page_size=2))) == 3
        redis_client.xgroup_create(fresh, "g", id="$")
        assert streams.trim(fresh, max_len=1).trimmed == 4
    with echomq_sync.Admin(live_sidecar.target) as admin:
        info = admin.describe_group(fresh, "g")
        assert info.pending == 0 and info.stream_length == 1
        assert admin.list_dead_letters(fresh).dead_letters == [] and list(admin.dead_letters(fresh)) == []
        with pytest.raises(PermanentError) as refused:
            admin.describe_group(fresh, "nobody")
        assert refused.value.code == grpc.StatusCode.NOT_FOUND


# -- the `async for` form --------------------------------------------------------------


async def test_iterated_deliveries_are_acked_explicitly(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    async with Streams(live_sidecar.target) as streams:
        appended = await streams.append_batch(fresh, [{"n": str(i)} for i in range(20)])
    seen: list[str] = []
    async with Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING, max_in_flight=4) as consumer:
        async for delivery in consumer.deliveries():
            seen.append(delivery.id)
            assert await delivery.ack()
            if len(seen) == 20:
                break
    assert seen == [a.id for a in appended]  # max_in_flight 4: only acks freed the next ones
    assert pending(redis_client, fresh, "g") == 0


async def test_an_iterated_fail_comes_back_with_the_next_attempt(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    async with Streams(live_sidecar.target) as streams:
        await streams.append(fresh, {"n": "1"})
    attempts: list[int] = []
    async with Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING) as consumer:
        async for delivery in consumer:
            attempts.append(delivery.attempts)
            if delivery.attempts == 1:
                await delivery.fail("later", retry_after=0.05)
            else:
                await delivery.ack()
                break
    assert attempts == [1, 2] and pending(redis_client, fresh, "g") == 0


async def test_break_leaves_the_unsettled_delivery_to_the_group(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    async with Streams(live_sidecar.target) as streams:
        await streams.append(fresh, {"n": "1"})
    async with Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING) as consumer:
        async for first in consumer:
            break  # not settled
        assert not first.settled and pending(redis_client, fresh, "g") == 1
    # Left to the group when the call closed: delivered again, attempts + 1.
    async with Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING) as again:
        async for second in again:
            await second.ack()
            break
    assert second.id == first.id and second.attempts == 2
    await until("the ack", lambda: pending(redis_client, fresh, "g") == 0)


async def test_an_exception_out_of_async_with_fails_what_the_body_held(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    async with Streams(live_sidecar.target) as streams:
        await streams.append(fresh, {"n": "1"})
    # max_deliveries 1: the Fail the client sends makes the next hand-over a
    # poison entry, and the dead letter carries the Fail's reason.
    with pytest.raises(RuntimeError, match="kaput"):
        async with Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING, max_deliveries=1,
                            retry_backoff_initial=0.05) as consumer:
            async for _ in consumer:
                raise RuntimeError("kaput")
    async with Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING, max_deliveries=1):
        await until("the dead letter", lambda: redis_client.xlen(f"{fresh}:dlq") == 1)
    [(_, fields)] = redis_client.xrange(f"{fresh}:dlq")
    assert fields[b"echomq.reason"] == b"kaput"


async def test_stop_waits_for_the_delivery_in_hand_and_ends_the_iteration(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    async with Streams(live_sidecar.target) as streams:
        await streams.append_batch(fresh, [{"n": "1"}, {"n": "2"}])
    consumer = Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING, max_in_flight=1)
    stopping: asyncio.Task[None] | None = None
    seen = 0
    async for delivery in consumer:  # starts the consumer
        seen += 1
        stopping = asyncio.create_task(consumer.stop(5.0))
        await asyncio.sleep(0.3)  # still working on it while stop() waits
        assert not stopping.done()
        await delivery.ack()
    assert seen == 1 and stopping is not None
    await stopping
    assert pending(redis_client, fresh, "g") == 0 and redis_client.xlen(fresh) == 2


async def test_the_iteration_raises_the_permanent_error(live_sidecar: Sidecar) -> None:
    consumer = Consumer(live_sidecar.target, "py:whole:bad", "g", start=Start.NEW, max_in_flight=100_000)
    with pytest.raises(PermanentError) as refused:
        async for _ in consumer:
            pass
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    await consumer.stop()


def test_the_sync_consumer_is_iterated_with_for(live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str) -> None:
    ids = [redis_client.xadd(fresh, {"n": str(i)}).decode() for i in range(5)]
    seen: list[str] = []
    with echomq_sync.Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING, max_in_flight=2) as consumer:
        for delivery in consumer:
            seen.append(delivery.stream_id)
            if len(seen) == 5:
                break  # not settled: left to the group
            assert delivery.ack()
    assert seen == ids
    assert pending(redis_client, fresh, "g") == 1  # the one in hand at the break
    # An exception out of the block fails what it held, with its message.
    with pytest.raises(ValueError, match="unparseable"):
        with echomq_sync.Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING, max_deliveries=2,
                                  retry_backoff_initial=0.05) as consumer:
            for delivery in consumer:
                assert delivery.attempts == 2 and delivery.stream_id == ids[4]
                raise ValueError("unparseable")
    with echomq_sync.Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING, max_deliveries=2):
        deadline = time.monotonic() + 20
        while redis_client.xlen(f"{fresh}:dlq") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
    [(_, fields)] = redis_client.xrange(f"{fresh}:dlq")
    assert fields[b"echomq.reason"] == b"unparseable" and pending(redis_client, fresh, "g") == 0


def test_stopping_the_sync_iteration_from_another_thread_ends_it(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    redis_client.xadd(fresh, {"n": "1"})
    consumer = echomq_sync.Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING)
    got = []
    for delivery in consumer:  # starts it; no `with`
        got.append(delivery)
        stopper = threading.Thread(target=consumer.stop, args=(5.0,))
        stopper.start()
        time.sleep(0.2)  # stop() waits for the delivery in hand
        assert stopper.is_alive()
        delivery.ack()
        stopper.join(10)
    assert len(got) == 1 and not stopper.is_alive()
    assert pending(redis_client, fresh, "g") == 0


# -- defaults ----------------------------------------------------------------------


@pytest.fixture
def small_default_sidecar(redis_server: RedisServer) -> Iterator[Sidecar]:
    """A sidecar whose `--default-max-in-flight` is 5, not 64."""
    car = Sidecar(redis_server.url, "py-small-default", ["--default-max-in-flight", "5"])
    try:
        car.start()
        yield car
    finally:
        car.close()


async def test_an_unset_max_in_flight_is_the_sidecars_default_and_sizes_the_pool(
    small_default_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    async with Streams(small_default_sidecar.target) as streams:
        await streams.append_batch(fresh, [{"n": str(i)} for i in range(12)])
    running, most = 0, 0
    release = asyncio.Event()

    async def handle(delivery: Delivery) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1

    async with Consumer(small_default_sidecar.target, fresh, "g", handle, start=Start.BEGINNING) as consumer:
        assert consumer.concurrency is None  # not known before the sidecar says
        assert (await consumer.wait_subscribed(10)).max_in_flight == 5
        await until("five handlers", lambda: running == 5)
        await asyncio.sleep(0.2)  # no sixth starts
        assert consumer.concurrency == 5 and most == 5
        release.set()
        await until("all acked", lambda: redis_client.xlen(fresh) == 12 and pending(redis_client, fresh, "g") == 0
                    and int(redis_client.xinfo_groups(fresh)[0]["lag"] or 0) == 0)


async def test_unset_flow_control_gets_the_cap_1024_and_64_handlers(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    """The adaptive window's cap is reported (1024), but the pool stays at 64."""
    async with Streams(live_sidecar.target) as streams:
        await streams.append_batch(fresh, [{"n": str(i)} for i in range(100)])
    running, most = 0, 0
    release = asyncio.Event()

    async def handle(delivery: Delivery) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1

    async with Consumer(live_sidecar.target, fresh, "g", handle, start=Start.BEGINNING) as consumer:
        assert consumer._subscribe.subscribe.max_in_flight == 0  # unset is sent as 0
        assert (await consumer.wait_subscribed(10)).max_in_flight == DEFAULT_MAX_IN_FLIGHT == 1024
        await until("64 handlers", lambda: running == 64)
        await asyncio.sleep(0.2)  # no 65th starts
        assert consumer.concurrency == DEFAULT_CONCURRENCY == 64 and most == 64
        release.set()
        await until("all acked", lambda: pending(redis_client, fresh, "g") == 0
                    and int(redis_client.xinfo_groups(fresh)[0]["lag"] or 0) == 0)


# -- every setting reaches the sidecar -------------------------------------------


async def test_dead_letter_stream_names_where_dead_letters_go(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    custom = f"{fresh}:graveyard"
    redis_client.delete(custom)
    async with Streams(live_sidecar.target) as streams:
        await streams.append(fresh, {"n": "1"})
    async with Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING, dead_letter_stream=custom) as c:
        async for delivery in c:
            await delivery.dead_letter("no")
            break
    await until("the dead letter", lambda: redis_client.xlen(custom) == 1)
    assert redis_client.xlen(f"{fresh}:dlq") == 0
    async with Admin(live_sidecar.target) as admin:
        [dead] = (await admin.list_dead_letters(fresh, dead_letter_stream=custom)).dead_letters
    assert dead.reason == "no"


async def test_no_ack_leaves_nothing_pending(live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str) -> None:
    async with Streams(live_sidecar.target) as streams:
        await streams.append_batch(fresh, [{"n": "1"}, {"n": "2"}])
    async with Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING, no_ack=True) as consumer:
        got = []
        async for delivery in consumer:
            got.append(delivery)  # never settled: at-most-once
            if len(got) == 2:
                break
        assert pending(redis_client, fresh, "g") == 0


async def test_retry_backoff_sets_the_redelivery_delay(live_sidecar: Sidecar, fresh: str) -> None:
    async with Streams(live_sidecar.target) as streams:
        await streams.append(fresh, {"n": "1"})
    starts: list[float] = []
    # The suite's sidecar caps retries at 1 s (--retry-backoff-max-ms 1000);
    # 2.4 s jittered into its upper half is at least 1.2 s.
    async with Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING,
                        retry_backoff_initial=2.4, retry_backoff_max=timedelta(seconds=2.4)) as consumer:
        async for delivery in consumer:
            starts.append(time.monotonic())
            if delivery.attempts == 1:
                await delivery.fail("again")  # no retry_after: the subscription's backoff
            else:
                await delivery.ack()
                break
    assert starts[1] - starts[0] >= 1.15, f"redelivered after {starts[1] - starts[0]:.2f} s"


async def test_ack_deadline_redelivers_what_is_held_too_long(live_sidecar: Sidecar, fresh: str) -> None:
    async with Streams(live_sidecar.target) as streams:
        await streams.append(fresh, {"n": "1"})
    seen: list[Delivery] = []
    async with Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING, ack_deadline=0.3,
                        retry_backoff_initial=0.05) as consumer:
        async for delivery in consumer:
            seen.append(delivery)  # the first is never settled
            if delivery.attempts >= 2:
                await delivery.ack()
                break
    assert [d.attempts for d in seen] == [1, 2] and seen[0].id == seen[1].id


async def test_max_deliveries_with_the_sync_consumer(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    async with Streams(live_sidecar.target) as streams:
        await streams.append(fresh, {"n": "1"})
    attempts: list[int] = []

    def always_fails(delivery: echomq_sync.SyncDelivery) -> None:
        attempts.append(delivery.attempts)
        raise ValueError("still broken")

    consumer = echomq_sync.Consumer(live_sidecar.target, fresh, "g", always_fails, start=Start.BEGINNING,
                                    max_deliveries=3, retry_backoff_initial=0.05)
    runner = asyncio.get_running_loop().run_in_executor(None, consumer.run)
    await until("the dead letter", lambda: redis_client.xlen(f"{fresh}:dlq") == 1)
    await asyncio.get_running_loop().run_in_executor(None, consumer.stop)
    await runner
    assert attempts == [1, 2, 3]


def test_the_sync_consumer_fails_transient_and_poison_by_exception_type(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    with echomq_sync.Streams(live_sidecar.target) as streams:
        flaky, poison = (streams.append(fresh, {"n": n}).id for n in ("flaky", "poison"))
    calls: list[tuple[str, int]] = []

    def handle(delivery: echomq_sync.SyncDelivery) -> None:
        calls.append((delivery.id, delivery.attempts))
        if delivery.id == poison:
            raise PoisonError("cannot parse")
        if len([c for c in calls if c[0] == flaky]) <= 2:
            raise TransientError("the database is down")
        if len([c for c in calls if c[0] == flaky]) == 3:
            delivery.fail("still down", kind=FailKind.TRANSIENT, retry_after=0.05)

    consumer = echomq_sync.Consumer(live_sidecar.target, fresh, "g", handle, start=Start.BEGINNING,
                                    max_deliveries=2, retry_backoff_initial=0.05)
    run_sync_consumer(consumer, lambda: len(calls) >= 5)
    assert calls.count((flaky, 1)) == 4, f"transient fails cost no attempt: {calls}"
    assert calls.count((poison, 1)) == 1 and redis_client.xlen(f"{fresh}:dlq") == 1
    assert pending(redis_client, fresh, "g") == 0


# -- LEASE_LOST --------------------------------------------------------------------


async def test_lease_lost_sets_the_event_and_no_verdict_follows(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    async with Streams(live_sidecar.target) as streams:
        await streams.append(fresh, {"n": "1"})
    errors: list[VerdictError] = []
    async with Consumer(live_sidecar.target, fresh, "g", start=Start.BEGINNING,
                        on_verdict_error=errors.append) as consumer:
        async for delivery in consumer:
            redis_client.xclaim(fresh, "g", "thief", 0, [delivery.stream_id])
            await asyncio.wait_for(delivery.lease_lost.wait(), 20)
            assert not await delivery.ack() and not await delivery.fail("x")
            break
        await asyncio.sleep(0.2)  # a verdict sent anyway would be answered NOT_PENDING by now
    assert [e.code for e in errors] == [VerdictErrorCode.LEASE_LOST] and errors[0].id == delivery.id
    # The thief still holds it: nothing of ours acknowledged it.
    assert redis_client.xpending_range(fresh, "g", "-", "+", 10)[0]["consumer"] == b"thief"


def test_the_sync_delivery_lease_lost_is_a_threading_event(
    live_sidecar: Sidecar, redis_client: redis.Redis, fresh: str
) -> None:
    redis_client.xadd(fresh, {"n": "1"})
    saw: list[bool] = []
    consumer: echomq_sync.Consumer

    def handle(delivery: echomq_sync.SyncDelivery) -> None:
        redis_client.xclaim(fresh, "g", "thief", 0, [delivery.stream_id])
        saw.append(delivery.lease_lost.wait(20))
        threading.Thread(target=consumer.stop).start()

    consumer = echomq_sync.Consumer(live_sidecar.target, fresh, "g", handle, start=Start.BEGINNING)
    consumer.run()
    assert saw == [True]
    assert redis_client.xpending_range(fresh, "g", "-", "+", 10)[0]["consumer"] == b"thief"


def _bounded(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Fails a test after 60 s instead of hanging: an iteration waits for
    deliveries forever by design, so a broken feature would otherwise stall
    the suite rather than fail it."""

    @functools.wraps(test)
    async def bounded(*args: Any, **kwargs: Any) -> None:
        await asyncio.wait_for(test(*args, **kwargs), 60)

    return bounded


for _name, _test in list(globals().items()):
    if _name.startswith("test_") and inspect.iscoroutinefunction(_test):
        globals()[_name] = _bounded(_test)
