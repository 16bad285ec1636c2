"""The AdminService for asyncio: describe a group, list and replay dead letters."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import grpc

from . import _convert
from ._channel import AioClient
from .errors import from_rpc_error
from .records import DeadLetterEntry, DeadLetterPage, GroupInfo, ReplayResult
from .v1 import admin_service_pb2_grpc as pb_grpc


class Admin(AioClient):
    """What is stuck, and moving dead letters back.

    ::

        async with Admin("127.0.0.1:50051") as admin:
            info = await admin.describe_group("orders", "billing")
            print(info.pending, info.lag, info.max_delivery_count)
            async for dead in admin.dead_letters("orders"):
                print(dead.entry.id, dead.reason, dead.attempts)
            result = await admin.replay_dead_letters("orders", count=100)

    `target` is `host:port`, `unix:/path`, or a `grpc.aio.Channel` you own;
    `timeout` (seconds, default none) bounds each call. Errors are
    `RpcError` (`.code`, `.details`), `PermanentError` for the codes of
    `errors.PERMANENT_CODES`; each method says which it can get.
    """

    _stub_class = pb_grpc.AdminServiceStub

    async def describe_group(self, stream: str, group: str) -> GroupInfo:
        """The state of `group` on `stream` (XINFO GROUPS, XINFO CONSUMERS,
        XPENDING): pending count, lag, last delivered id, consumers, the oldest
        pending entry and its age, the highest delivery count, stream length.
        For a sharded stream's name, the sum over its shards (each in `shards`).

        Raises `PermanentError`: NOT_FOUND when the stream or the group does not
        exist, FAILED_PRECONDITION when the key is not a stream,
        INVALID_ARGUMENT for an empty name; `RpcError` UNAVAILABLE when Redis
        cannot be reached."""
        request = _convert.describe_request(stream, group)
        try:
            response = await self._stub.DescribeGroup(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(f"DescribeGroup(stream={stream!r}, group={group!r})", error) from None
        return _convert.group_info(response)

    async def list_dead_letters(
        self, stream: str, *, dead_letter_stream: str | None = None, start_id: str | None = None, count: int = 0
    ) -> DeadLetterPage:
        """One page of the dead letters of `stream`, oldest first (XRANGE on
        the dead-letter stream: `dead_letter_stream`, default `<stream>:dlq`).
        `start_id` (inclusive; None: the oldest) is a dead-letter stream id,
        e.g. a page's `next_start_id`; `count` the most to return (0: the
        sidecar's 100; at most 10,000). A missing dead-letter stream lists
        nothing.

        Raises `PermanentError` INVALID_ARGUMENT for a bad name or id,
        FAILED_PRECONDITION when the key is not a stream; `RpcError`
        UNAVAILABLE."""
        request = _convert.list_dead_letters_request(stream, dead_letter_stream, start_id, count)
        try:
            response = await self._stub.ListDeadLetters(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(f"ListDeadLetters(stream={stream!r})", error) from None
        return _convert.dead_letter_page(response)

    async def dead_letters(
        self, stream: str, *, dead_letter_stream: str | None = None, page_size: int = 0
    ) -> AsyncIterator[DeadLetterEntry]:
        """Every dead letter of `stream`, oldest first, page by page (see
        `list_dead_letters`)."""
        start: str | None = None
        while True:
            page = await self.list_dead_letters(
                stream, dead_letter_stream=dead_letter_stream, start_id=start, count=page_size
            )
            for dead in page.dead_letters:
                yield dead
            if page.next_start_id is None:
                return
            start = page.next_start_id

    async def replay_dead_letters(
        self, stream: str, *, ids: Iterable[str] = (), dead_letter_stream: str | None = None, count: int = 0
    ) -> ReplayResult:
        """Moves dead letters back to `stream`, their source: each is appended
        there (new stream id, same branded id, original payload) and deleted
        from the dead-letter stream in one script, so a crash neither loses
        nor duplicates one. Every group of `stream` reads a replayed entry
        again (also one that had acknowledged it). `ids` are dead-letter stream
        ids (`DeadLetterEntry.entry.stream_id`); without them the oldest
        `count` (0: 100; at most 10,000). Ids not there come back in
        `not_found_ids`; dead letters of another source stream sharing the
        dead-letter stream stay (`other_source_ids`).

        Raises `PermanentError`: INVALID_ARGUMENT for a bad name or id, or a
        dead-letter stream equal to `stream`; FAILED_PRECONDITION when a key is
        not a stream, or `stream` does not exist or has no consumer group (the
        entries would reach no one); `RpcError` UNAVAILABLE. Entries move 100
        at a time: an error after the first batch says how many moved."""
        request = _convert.replay_request(stream, ids, dead_letter_stream, count)
        try:
            response = await self._stub.ReplayDeadLetters(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(f"ReplayDeadLetters(stream={stream!r})", error) from None
        return _convert.replay_result(response)

