"""The whole StreamService for asyncio: `Streams` is a `Producer` (Append,
AppendBatch) that also reads (Read, by stream id or instant, page by page or
as one async iterator) and trims (Trim, safe by default)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime

import grpc

from . import _convert
from ._convert import Bound
from .errors import from_rpc_error
from .producer import Producer
from .records import Entry, ReadPage, Trimmed


class Streams(Producer):
    """StreamService: append (as `Producer`), read and trim.

    ::

        async with Streams("127.0.0.1:50051") as streams:
            page = await streams.read("orders", start=datetime(2026, 12, 1), count=500)
            async for entry in streams.read_all("orders", start="1718000000000-0"):
                ...
            done = await streams.trim("orders", max_len=100_000)   # safe: spares what groups need

    Errors are `RpcError` (`.code`, `.details`), `PermanentError` for the
    codes of `errors.PERMANENT_CODES`: INVALID_ARGUMENT for a bad stream name
    or id, or a sharded stream's name (name one shard's key);
    FAILED_PRECONDITION when the key is not a stream. UNAVAILABLE (Redis or
    the sidecar unreachable) is an `RpcError`: reads are safe to retry.
    Arguments the sidecar would refuse anyway (no stream, `count` above
    10,000, no or several trim bounds) raise `ValueError` before any call.
    """

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
    ) -> Trimmed:
        """Removes the oldest entries of `stream` (XTRIM MINID). Give exactly
        one bound: `max_len` (keep the newest that many entries, at least 1),
        `min_id` (remove entries with a smaller stream id) or `before` (remove
        entries appended before that instant).

        Safe by default: never removes an entry that a group of the stream
        still has pending or has not yet been delivered; the bound is raised
        to the oldest such entry (`Trimmed.held_back_by_groups` says so).
        `ignore_groups=True` trims as asked, and those entries are lost to the
        groups. `approximate=True` lets Redis trim whole nodes only (cheaper;
        may keep a few more, never removes more)."""
        request = _convert.trim_request(stream, max_len, min_id, before, approximate, ignore_groups)
        try:
            response = await self._stub.Trim(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(f"Trim(stream={stream!r})", error) from None
        return _convert.trimmed(response)
