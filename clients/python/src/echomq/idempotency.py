"""Idempotency helpers keyed by the branded id.

Why: delivery is at-least-once. An entry comes back after a handler failure, a
dropped call, a sidecar crash between your side effect and the XACK, or a
peer's reclaim; a dead-lettered entry can be replayed. Every copy carries the
same branded id, so the id is the deduplication key:

- `SeenSet` answers "has this id been processed?". Check before the work, mark
  after it succeeded (never before: a failed attempt must be retried). A crash
  between the work and the mark repeats the work once, so for exactly-once
  effects keep the mark in the same transaction as the effect (a store backed
  by your database).
- `NewerWins` keeps, per business key (an order id, an account), the highest
  branded id applied, and skips an older or equal one. Branded ids order like
  the stream (mint order), and their fixed-width lowercase hex text compares
  like their bytes, so a string comparison is enough: a stale replay of an old
  update never overwrites a newer state.

The in-memory stores suit a single process and tests; plug a shared store
(Redis, SQL) into the same protocols for several replicas.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from .delivery import Delivery

T = TypeVar("T")

_BRANDED_ID = re.compile(r"[0-9a-f]{28}")


def is_branded_id(text: str) -> bool:
    """True for a branded id's text form: exactly 28 lowercase hex characters."""
    return _BRANDED_ID.fullmatch(text) is not None


def _checked(id: str) -> str:
    if not is_branded_id(id):
        raise ValueError(f"{id!r} is not a branded id (28 lowercase hex characters)")
    return id


class SeenStore(Protocol):
    """Where a `SeenSet` keeps the ids it has processed."""

    async def contains(self, id: str) -> bool:
        """True when `id` was added (and not evicted)."""
        ...

    async def add(self, id: str) -> None:
        """Records `id` as processed."""
        ...


class MemorySeenStore:
    """A bounded in-memory seen-set: beyond `max_ids` the oldest-added id is
    forgotten (so a very late duplicate of it would be processed again)."""

    def __init__(self, max_ids: int = 100_000) -> None:
        if max_ids < 1:
            raise ValueError("max_ids must be at least 1")
        self.max_ids = max_ids
        self._ids: OrderedDict[str, None] = OrderedDict()

    async def contains(self, id: str) -> bool:
        return id in self._ids

    async def add(self, id: str) -> None:
        self._ids[id] = None
        self._ids.move_to_end(id)
        while len(self._ids) > self.max_ids:
            self._ids.popitem(last=False)

    def __len__(self) -> int:
        return len(self._ids)


class SeenSet:
    """Has this branded id been processed? See the module doc for the reasoning."""

    def __init__(self, store: SeenStore | None = None) -> None:
        self.store: SeenStore = store if store is not None else MemorySeenStore()

    async def seen(self, id: str) -> bool:
        """True when `id` was marked processed."""
        return await self.store.contains(_checked(id))

    async def mark(self, id: str) -> None:
        """Marks `id` processed. Call it after the work succeeded."""
        await self.store.add(_checked(id))

    def guard(self, handler: Callable[[Delivery], Awaitable[object]]) -> Callable[[Delivery], Awaitable[None]]:
        """Wraps a consumer handler: a delivery whose id was already processed
        is acked without calling `handler`; after `handler` returns, the id is
        marked. If the handler raises, nothing is marked and the entry is retried.
        """

        async def guarded(delivery: Delivery) -> None:
            if await self.seen(delivery.id):
                return
            await handler(delivery)
            await self.mark(delivery.id)

        return guarded


class VersionStore(Protocol):
    """Where a `NewerWins` keeps the highest branded id applied per key."""

    async def get(self, key: str) -> str | None:
        """The highest id recorded for `key`, or None."""
        ...

    async def put_if_newer(self, key: str, id: str) -> bool:
        """Records `id` for `key` if it is greater than the recorded one (or
        there is none), atomically; True when it was recorded."""
        ...


class MemoryVersionStore:
    """An in-memory `VersionStore` (one dict; unbounded: one entry per key)."""

    def __init__(self) -> None:
        self._latest: dict[str, str] = {}

    async def get(self, key: str) -> str | None:
        return self._latest.get(key)

    async def put_if_newer(self, key: str, id: str) -> bool:
        current = self._latest.get(key)
        if current is not None and id <= current:
            return False
        self._latest[key] = id
        return True


class NewerWins:
    """Per business key, apply only what is newer than what was applied.

    ::

        latest = NewerWins()

        async def handle(delivery):
            await latest.apply(delivery.payload["account"].decode(), delivery.id,
                               lambda: save_balance(delivery))
    """

    def __init__(self, store: VersionStore | None = None) -> None:
        self.store: VersionStore = store if store is not None else MemoryVersionStore()

    async def is_newer(self, key: str, id: str) -> bool:
        """True when `id` is greater than every id applied for `key`."""
        current = await self.store.get(key)
        return current is None or _checked(id) > current

    async def record(self, key: str, id: str) -> bool:
        """Records `id` as applied for `key`; False if a newer or equal one is recorded."""
        return await self.store.put_if_newer(key, _checked(id))

    async def apply(self, key: str, id: str, work: Callable[[], Awaitable[T]]) -> bool:
        """Runs `work` and records `id` if `id` is newer than what `key` has;
        returns whether it ran. If `work` raises, nothing is recorded."""
        if not await self.is_newer(key, id):
            return False
        await work()
        await self.record(key, id)
        return True
