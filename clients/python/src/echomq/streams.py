"""The whole StreamService for asyncio: `Streams` appends (Append,
AppendBatch), reads (Read, by stream id or instant, page by page or as one
async iterator) and trims (Trim, safe by default). `Producer` is its
deprecated name."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from datetime import datetime
from typing import TYPE_CHECKING

import grpc

from . import _convert
from ._deprecation import renamed_class
from ._channel import AioClient
from ._convert import Bound
from .errors import from_rpc_error
from ._appends import AppendResult, BatchEntry, Fields, append_batch_request, append_request, appended
from .records import Entry, ReadPage, TrimResult
from .v1 import stream_service_pb2_grpc as pb_grpc


class Streams(AioClient):
    """StreamService: append, read and trim.

    ::

        async with Streams("127.0.0.1:50051") as streams:
            appended = await streams.append("orders", {"sku": b"42", "note": "text is UTF-8"})
            page = await streams.read("orders", start=datetime(2026, 12, 1), count=500)
            async for entry in streams.read_all("orders", start="1718000000000-0"):
                ...
            done = await streams.trim("orders", max_len=100_000)   # safe: spares what groups need

    `target` is `host:port`, `unix:/path`, or a `grpc.aio.Channel` you own.
    `timeout` (seconds, default none) bounds each call.

    Appends are not retried by the client: an append answered UNAVAILABLE or
    DEADLINE_EXCEEDED (or cut off) may or may not have been written. Give it a
    `dedup_key` and retry it with the same key: the retry writes nothing if
    the first one was written, and answers its ids with `duplicate` set
    (within the sidecar's `--dedup-window-ms`, 2 minutes by default)::

        for attempt in range(5):
            try:
                appended = await streams.append("orders", fields, dedup_key="order-42")
                break
            except RpcError as error:
                if error.permanent or attempt == 4:
                    raise
                await asyncio.sleep(0.5 * 2**attempt)

    Errors are `RpcError` (`.code`, `.details`), `PermanentError` for the
    codes of `errors.PERMANENT_CODES`: INVALID_ARGUMENT for a bad stream name
    or id, or a sharded stream's name given to read or trim (name one shard's
    key); FAILED_PRECONDITION when the key is not a stream. UNAVAILABLE (Redis
    or the sidecar unreachable) is an `RpcError`: reads are safe to retry.
    Arguments the sidecar would refuse anyway (no stream, `count` above
    10,000, no or several trim bounds) raise `ValueError` before any call.
    """

    _stub_class = pb_grpc.StreamServiceStub

    async def append(
        self,
        stream: str,
        fields: Fields,
        *,
        max_len: int = 0,
        partition_key: str | None = None,
        dedup_key: str | None = None,
    ) -> AppendResult:
        """Appends one entry; with `max_len` > 0 the stream is trimmed to about
        that many entries (`MAXLEN ~`). A field named like the reserved
        branded-id field (`id` by default) is refused (`PermanentError`).

        `partition_key` is for a sharded stream (the sidecar's
        `--sharded-streams`): entries with the same key go to the same shard,
        so they are consumed in the order they were appended; `None` (or
        empty) takes the shards in turn. A stream that is not sharded ignores
        it. `AppendResult.stream` is the stream key written (the shard's key).

        `dedup_key` makes the append idempotent: if an append to `stream` with
        the same key was recorded within the sidecar's `--dedup-window-ms`
        (2 minutes by default), nothing is written and the result is that
        append's, with `duplicate` set. None (or empty): no deduplication. A
        key over the sidecar's `--max-name-bytes` (1024) is refused
        (`PermanentError`). On a sharded stream, retry with the same
        `partition_key` (or none)."""
        request = append_request(stream, fields, max_len, partition_key, dedup_key)
        try:
            response = await self._stub.Append(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(f"Append(stream={stream!r})", error) from None
        return appended(response)

    async def append_batch(
        self,
        stream: str,
        entries: Iterable[Fields | BatchEntry],
        *,
        max_len: int = 0,
        partition_key: str | None = None,
    ) -> list[AppendResult]:
        """Appends 1 to 10,000 entries to one stream atomically, in order; the
        results are in the same order. On a sharded stream the whole batch
        goes to one shard: `partition_key`'s (as for `append`), or the next
        in turn without one (the shard of its first dedup key, if any).

        An entry is its fields, or a `BatchEntry` carrying a `dedup_key` too:
        an entry whose key is recorded, or was used by an earlier entry of the
        batch, is not written, and its result is the first one's with
        `duplicate` set (see `append`)."""
        request = append_batch_request(stream, entries, max_len, partition_key)
        try:
            response = await self._stub.AppendBatch(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(f"AppendBatch(stream={stream!r}, entries={len(request.entries)})", error) from None
        return [appended(e) for e in response.entries]

    async def read(
        self, stream: str, *, start: Bound | None = None, end: Bound | None = None, count: int = 0
    ) -> ReadPage:
        """One page of `stream`, oldest first, without a consumer group (XRANGE:
        nothing is acknowledged or counted).

        `start` and `end` are inclusive bounds, each a stream id (`<ms>-<seq>`
        or `<ms>`) or a `datetime` (an instant; naive means UTC), None for
        the stream's oldest / newest entry. `count`: the most entries (0: the
        sidecar's 100; at most 10,000). The page's `next_start_id` is where
        the next page starts (pass it as `start`, same `end`); None at the
        end of the range. A missing stream reads as empty."""
        request = _convert.read_request(stream, start, end, count)
        try:
            response = await self._stub.Read(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(f"Read(stream={stream!r})", error) from None
        return _convert.read_page(response)

    async def read_pages(
        self, stream: str, *, start: Bound | None = None, end: Bound | None = None, page_size: int = 0
    ) -> AsyncIterator[ReadPage]:
        """Every page of the range, following `next_start_id` (one Read per
        page; `page_size` as `read`'s `count`). Entries appended while paging
        are included if they fall in the range."""
        while True:
            page = await self.read(stream, start=start, end=end, count=page_size)
            yield page
            if page.next_start_id is None:
                return
            start = page.next_start_id

    async def read_all(
        self, stream: str, *, start: Bound | None = None, end: Bound | None = None, page_size: int = 0
    ) -> AsyncIterator[Entry]:
        """Every entry of the range, oldest first, page by page (see `read_pages`)."""
        async for page in self.read_pages(stream, start=start, end=end, page_size=page_size):
            for entry in page.entries:
                yield entry

    async def trim(
        self,
        stream: str,
        *,
        max_len: int | None = None,
        min_id: str | None = None,
        before: datetime | None = None,
        approximate: bool = False,
        ignore_groups: bool = False,
    ) -> TrimResult:
        """Removes the oldest entries of `stream` (XTRIM MINID). Give exactly
        one bound: `max_len` (keep the newest that many entries, at least 1),
        `min_id` (remove entries with a smaller stream id) or `before` (remove
        entries appended before that instant).

        Safe by default: never removes an entry that a group of the stream
        still has pending or has not yet been delivered; the bound is raised
        to the oldest such entry (`TrimResult.held_back_by_groups` says so).
        `ignore_groups=True` trims as asked, and those entries are lost to the
        groups. `approximate=True` lets Redis trim whole nodes only (cheaper;
        may keep a few more, never removes more)."""
        request = _convert.trim_request(stream, max_len, min_id, before, approximate, ignore_groups)
        try:
            response = await self._stub.Trim(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(f"Trim(stream={stream!r})", error) from None
        return _convert.trimmed(response)


if TYPE_CHECKING:
    Producer = Streams
else:
    #: Deprecated: the old name of `Streams`, which appends, reads and trims.
    Producer = renamed_class(Streams, "echomq.Producer", "echomq.Streams")
