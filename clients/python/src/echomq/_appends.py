"""What appends send and answer (`AppendResult`, `BatchEntry`, the request
builders); the appends themselves are `echomq.Streams.append` and
`append_batch`."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import NamedTuple

from google.protobuf.duration_pb2 import Duration

from ._convert import to_timestamp
from ._fields import Fields as Fields  # re-exported: its home is `_fields`
from ._fields import encode_fields as encode_fields
from .v1 import stream_service_pb2 as pb


class AppendResult(NamedTuple):
    """Where an entry landed."""

    #: The branded id, 28 lowercase hex characters: the entry's idempotency key.
    id: str
    #: The stream id the entry got, `<ms>-<seq>`; "" for a scheduled entry
    #: (its stream id is only known when it enters the stream).
    stream_id: str
    #: The stream key written: the one appended to, or for a sharded stream
    #: (`--sharded-streams`) the shard's key, `<stream>:{<stream>:<k>}`.
    stream: str = ""
    #: True when the append's `dedup_key` was already recorded on the stream
    #: (within the sidecar's `--dedup-window-ms`): nothing was written, and
    #: `id`, `stream_id` and `stream` are the first append's. Always False
    #: without a dedup key.
    duplicate: bool = False
    #: True when the entry was scheduled (`deliver_at` or `delay` in the
    #: future): `id` is final, `stream_id` is "", and the entry enters the
    #: stream when due (`Streams.cancel_scheduled` can still remove it). A
    #: duplicate of a scheduled append says so too.
    scheduled: bool = False


class BatchEntry(NamedTuple):
    """An entry of `append_batch` with a dedup key or a schedule; a plain
    mapping of fields is an entry with neither, and a batch may mix both::

        await streams.append_batch("orders", [
            BatchEntry({"order": "42"}, dedup_key="order-42"),
            BatchEntry({"remind": "42"}, delay=timedelta(hours=1)),
            {"note": "no key: never deduplicated"},
        ])

    An entry whose key is recorded on the stream, or was used by an earlier
    entry of the same batch, is not written: its result has `duplicate` set
    and the first one's ids. A scheduled entry's result has `scheduled` set."""

    #: The entry's fields, as for `Streams.append`.
    fields: Fields
    #: As `Streams.append`'s `dedup_key`; None (or empty): no deduplication.
    dedup_key: str | None = None
    #: As `Streams.append`'s `deliver_at`: the instant the entry enters the
    #: stream (naive means UTC). None: at once.
    deliver_at: datetime | None = None
    #: As `Streams.append`'s `delay`: enter the stream this long after the
    #: append. None: at once.
    delay: timedelta | None = None


def to_duration(span: timedelta) -> Duration:
    duration = Duration()
    duration.FromTimedelta(span)
    return duration


def schedule(
    message: pb.AppendRequest | pb.BatchEntry, deliver_at: datetime | None, delay: timedelta | None
) -> None:
    """Sets a request's or batch entry's schedule, as given: both, a negative
    delay or one past the horizon too (the sidecar refuses those with
    INVALID_ARGUMENT, and says why).

    Raises TypeError when `deliver_at` is not a `datetime` or `delay` not a
    `timedelta` (a number of seconds or a date string would be ambiguous)."""
    if deliver_at is not None:
        if not isinstance(deliver_at, datetime):
            raise TypeError(
                f"deliver_at must be a datetime.datetime (naive means UTC), got {type(deliver_at).__name__} "
                f"{deliver_at!r}; for a delay, pass delay=timedelta(...)"
            )
        message.deliver_at.CopyFrom(to_timestamp(deliver_at))
    if delay is not None:
        if not isinstance(delay, timedelta):
            raise TypeError(
                f"delay must be a datetime.timedelta, e.g. timedelta(minutes=10), got {type(delay).__name__} {delay!r}"
            )
        message.delay.CopyFrom(to_duration(delay))


def append_request(
    stream: str,
    fields: Fields,
    max_len: int,
    partition_key: str | None = None,
    dedup_key: str | None = None,
    deliver_at: datetime | None = None,
    delay: timedelta | None = None,
) -> pb.AppendRequest:
    request = pb.AppendRequest(
        stream=stream,
        fields=encode_fields(fields),
        max_len=max_len,
        partition_key=partition_key or "",
        dedup_key=dedup_key or "",
    )
    schedule(request, deliver_at, delay)
    return request


def batch_entry(entry: Fields | BatchEntry) -> pb.BatchEntry:
    if isinstance(entry, BatchEntry):
        message = pb.BatchEntry(fields=encode_fields(entry.fields), dedup_key=entry.dedup_key or "")
        schedule(message, entry.deliver_at, entry.delay)
        return message
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


def appended(response: pb.AppendResponse) -> AppendResult:
    return AppendResult(response.id, response.stream_id, response.stream, response.duplicate, response.scheduled)
