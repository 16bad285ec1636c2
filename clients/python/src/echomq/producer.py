"""The asyncio producer: Append and AppendBatch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import grpc

from ._channel import AioClient, ChannelOptions
from .errors import from_rpc_error
from .options import Seconds, seconds
from .v1 import stream_service_pb2 as pb
from .v1 import stream_service_pb2_grpc as pb_grpc

#: Field values: bytes, or text (sent as UTF-8).
Fields = Mapping[str, bytes | bytearray | memoryview | str]


class Appended(NamedTuple):
    """Where an entry landed."""

    #: The branded id, 28 lowercase hex characters: the entry's idempotency key.
    id: str
    #: The stream id the entry got, `<ms>-<seq>`.
    stream_id: str
    #: The stream key written: the one appended to, or for a sharded stream
    #: (`--sharded-streams`) the shard's key, `<stream>:{<stream>:<k>}`.
    stream: str = ""
    #: True when the append's `dedup_key` was already recorded on the stream
    #: (within the sidecar's `--dedup-window-ms`): nothing was written, and
    #: `id`, `stream_id` and `stream` are the first append's. Always False
    #: without a dedup key.
    duplicate: bool = False


class BatchEntry(NamedTuple):
    """An entry of `append_batch` with a dedup key; a plain mapping of fields
    is an entry without one, and a batch may mix both::

        await producer.append_batch("orders", [
            BatchEntry({"order": "42"}, dedup_key="order-42"),
            {"note": "no key: never deduplicated"},
        ])

    An entry whose key is recorded on the stream, or was used by an earlier
    entry of the same batch, is not written: its result has `duplicate` set
    and the first one's ids."""

    #: The entry's fields, as for `Producer.append`.
    fields: Fields
    #: As `Producer.append`'s `dedup_key`; None (or empty): no deduplication.
    dedup_key: str | None = None


def encode_fields(fields: Fields) -> dict[str, bytes]:
    """Field values as bytes; text is encoded as UTF-8."""
    encoded: dict[str, bytes] = {}
    for name, value in fields.items():
        if not isinstance(name, str):
            raise TypeError(f"field names are text, got {type(name).__name__}")
        encoded[name] = value.encode() if isinstance(value, str) else bytes(value)
    return encoded


def append_request(
    stream: str, fields: Fields, max_len: int, partition_key: str | None = None, dedup_key: str | None = None
) -> pb.AppendRequest:
    return pb.AppendRequest(
        stream=stream,
        fields=encode_fields(fields),
        max_len=max_len,
        partition_key=partition_key or "",
        dedup_key=dedup_key or "",
    )


def batch_entry(entry: Fields | BatchEntry) -> pb.BatchEntry:
    if isinstance(entry, BatchEntry):
        return pb.BatchEntry(fields=encode_fields(entry.fields), dedup_key=entry.dedup_key or "")
    return pb.BatchEntry(fields=encode_fields(entry))


def append_batch_request(
    stream: str, entries: Iterable[Fields | BatchEntry], max_len: int, partition_key: str | None = None
) -> pb.AppendBatchRequest:
    return pb.AppendBatchRequest(
        stream=stream,
        entries=[batch_entry(e) for e in entries],
        max_len=max_len,
        partition_key=partition_key or "",
    )


def appended(response: pb.AppendResponse) -> Appended:
    return Appended(response.id, response.stream_id, response.stream, response.duplicate)


class Producer(AioClient):
    """Appends entries to streams through the sidecar.

    ::

        async with Producer("127.0.0.1:50051") as producer:
            appended = await producer.append("orders", {"sku": b"42", "note": "text is UTF-8"})

    `target` is `host:port`, `unix:/path`, or a `grpc.aio.Channel` you own.
    `timeout` (seconds, default none) bounds each call. Appends are not retried
    by the client: an append answered UNAVAILABLE or DEADLINE_EXCEEDED (or cut
    off) may or may not have been written. Give it a `dedup_key` and retry it
    with the same key: the retry writes nothing if the first one was written,
    and answers its ids with `duplicate` set (within the sidecar's
    `--dedup-window-ms`, 2 minutes by default)::

        for attempt in range(5):
            try:
                appended = await producer.append("orders", fields, dedup_key="order-42")
                break
            except RpcError as error:
                if error.permanent or attempt == 4:
                    raise
                await asyncio.sleep(0.5 * 2**attempt)

    Errors raise `RpcError` (`PermanentError` for INVALID_ARGUMENT and the
    like).
    """

    def __init__(
        self,
        target: str | grpc.aio.Channel,
        *,
        timeout: Seconds | None = None,
        channel_options: ChannelOptions = (),
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    ) -> None:
        super().__init__(target, None if timeout is None else seconds(timeout), channel_options, interceptors)
        self._stub = pb_grpc.StreamServiceStub(self._channel)

    async def append(
        self,
        stream: str,
        fields: Fields,
        *,
        max_len: int = 0,
        partition_key: str | None = None,
        dedup_key: str | None = None,
    ) -> Appended:
        """Appends one entry; with `max_len` > 0 the stream is trimmed to about
        that many entries (`MAXLEN ~`). A field named like the reserved
        branded-id field (`id` by default) is refused (`PermanentError`).

        `partition_key` is for a sharded stream (the sidecar's
        `--sharded-streams`): entries with the same key go to the same shard,
        so they are consumed in the order they were appended; `None` (or
        empty) takes the shards in turn. A stream that is not sharded ignores
        it. `Appended.stream` is the stream key written (the shard's key).

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
    ) -> list[Appended]:
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

