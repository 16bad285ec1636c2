"""The idempotency helpers: a seen-set and newer-wins, keyed by branded id."""

from __future__ import annotations

import pytest

from echomq import MemorySeenStore, NewerWins, SeenSet, is_branded_id
from echomq.consumer import _Call
from echomq.delivery import Delivery
from echomq.v1 import consumer_service_pb2 as pb

OLD = "01a226af809e0000000000000000"
NEW = "01a226af809e0000000000000001"
LATER_MS = "01a226af809f0000000000000000"


def test_branded_ids_are_28_lowercase_hex() -> None:
    assert is_branded_id(OLD)
    assert not is_branded_id(OLD.upper()) and not is_branded_id(OLD[:-1]) and not is_branded_id("1718000000000-0")


def test_text_order_is_stream_order() -> None:
    assert OLD < NEW < LATER_MS


async def test_seen_set_marks_after_success_only() -> None:
    seen = SeenSet()
    calls: list[str] = []

    async def handler(delivery: Delivery) -> None:
        calls.append(delivery.id)
        if len(calls) == 1:
            raise RuntimeError("first attempt fails")

    guarded = seen.guard(handler)
    delivery = Delivery.from_proto(pb.Delivery(id=OLD), _Call())
    with pytest.raises(RuntimeError):
        await guarded(delivery)
    assert not await seen.seen(OLD)  # a failure is retried, not skipped
    await guarded(delivery)
    await guarded(delivery)  # the duplicate is skipped
    assert calls == [OLD, OLD]
    assert await seen.seen(OLD)


async def test_memory_seen_store_is_bounded() -> None:
    store = MemorySeenStore(max_ids=2)
    for id in (OLD, NEW, LATER_MS):
        await store.add(id)
    assert len(store) == 2 and not await store.contains(OLD) and await store.contains(LATER_MS)


async def test_newer_wins_skips_older_and_equal_ids() -> None:
    latest = NewerWins()
    applied: list[str] = []

    async def apply(id: str) -> bool:
        async def work() -> None:
            applied.append(id)

        return await latest.apply("account-1", id, work)

    assert await apply(NEW)
    assert not await apply(NEW)  # a redelivery
    assert not await apply(OLD)  # a stale replay
    assert await apply(LATER_MS)
    assert await latest.apply("account-2", OLD, _nothing)  # keys are independent
    assert applied == [NEW, LATER_MS]


async def _nothing() -> None:
    pass


async def test_newer_wins_records_nothing_when_the_work_fails() -> None:
    latest = NewerWins()

    async def boom() -> None:
        raise RuntimeError("db down")

    with pytest.raises(RuntimeError):
        await latest.apply("k", NEW, boom)
    assert await latest.is_newer("k", NEW)


async def test_ids_are_validated() -> None:
    with pytest.raises(ValueError):
        await NewerWins().record("k", "not-an-id")
