"""The whole StreamService for asyncio: `Streams` appends (Append,
AppendBatch, at once or scheduled), reads (Read, by stream id or instant,
page by page or as one async iterator), trims (Trim, safe by default) and
lists and cancels scheduled entries (ListScheduled, CancelScheduled).
`Producer` is its deprecated name."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import grpc

from . import _convert
from ._deprecation import renamed_class
from ._channel import AioClient
from ._convert import Bound
from .errors import NotScheduledError, from_rpc_error
from ._appends import AppendResult, BatchEntry, Fields, append_batch_request, append_request, appended
from .records import Entry, ReadPage, ScheduledEntry, ScheduledPage, TrimResult
from .v1 import stream_service_pb2 as stream_pb
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
        deliver_at: datetime | None = None,
        delay: timedelta | None = None,
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
        `partition_key` (or none).

        `deliver_at` (an instant; naive means UTC) or `delay` (after the
        append, on the Redis server's clock) schedules the entry: it gets its
        branded id now (`AppendResult.scheduled` is set, `stream_id` is "")
        and enters the stream when due (within the sidecar's
        `--schedule-poll-ms`), exactly once; until then no consumer or `read`
        sees it, `list_scheduled` does and `cancel_scheduled` removes it. An
        instant already past appends at once. Both, a negative delay, more
        than 365 days ahead, or either with `max_len` is refused by the
        sidecar (`PermanentError`, INVALID_ARGUMENT), nothing written."""
        request = append_request(stream, fields, max_len, partition_key, dedup_key, deliver_at, delay)
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
        `duplicate` set (see `append`); one with `deliver_at` or `delay` is
        scheduled (see `append`), and its result has `scheduled` set. A batch
        may mix entries appended at once and scheduled ones."""
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

    async def cancel_scheduled(self, stream: str, id: str) -> datetime:
        """Cancels the scheduled entry `id` (its branded id) on `stream`
        before it enters the stream: it is never delivered. Returns when it
        was due (UTC). `stream` is the key the append answered
        (`AppendResult.stream`: a sharded stream's shard key).

        Raises `NotScheduledError` (a `PermanentError`, code NOT_FOUND) when
        no such entry is scheduled there: it entered the stream already (a
        cancel and a move race, and exactly one wins), was cancelled, or was
        never scheduled there. `PermanentError` (INVALID_ARGUMENT) for a bad
        stream name or an id that is not a branded id."""
        request = stream_pb.CancelScheduledRequest(stream=stream, id=id)
        try:
            response = await self._stub.CancelScheduled(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            operation = f"CancelScheduled(stream={stream!r}, id={id!r})"
            if error.code() == grpc.StatusCode.NOT_FOUND:
                raise NotScheduledError(operation, grpc.StatusCode.NOT_FOUND, error.details() or "") from None
            raise from_rpc_error(operation, error) from None
        return _convert.from_timestamp(response.deliver_at)

    async def list_scheduled(self, stream: str, *, page_token: str | None = None, count: int = 0) -> ScheduledPage:
        """One page of the entries scheduled on `stream` (a stream key: list
        each shard's of a sharded stream) that have not entered it yet, due
        first first. `page_token`: the previous page's `next_page_token`
        (None: from the start). `count`: the most entries (0: the sidecar's
        100; over 10,000 is its INVALID_ARGUMENT). `ScheduledPage.total` is
        how many the key has scheduled in all."""
        request = stream_pb.ListScheduledRequest(stream=stream, page_token=page_token or "", count=count)
        try:
            response = await self._stub.ListScheduled(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(f"ListScheduled(stream={stream!r})", error) from None
        return _convert.scheduled_page(response)

    async def scheduled(self, stream: str, *, page_size: int = 0) -> AsyncIterator[ScheduledEntry]:
        """Every entry scheduled on `stream` that has not entered it yet, due
        first first, page by page (one ListScheduled per page; `page_size` as
        `list_scheduled`'s `count`)::

            async for entry in streams.scheduled("orders"):
                print(entry.id, entry.deliver_at)
        """
        token: str | None = None
        while True:
            page = await self.list_scheduled(stream, page_token=token, count=page_size)
            for entry in page.entries:
                yield entry
            if page.next_page_token is None:
                return
            token = page.next_page_token


if TYPE_CHECKING:
    Producer = Streams
else:
    #: Deprecated: the old name of `Streams`, which appends, reads and trims.
    Producer = renamed_class(Streams, "echomq.Producer", "echomq.Streams")
