"""Wire ↔ Python conversions shared by the asyncio and blocking clients:
instants, durations, entries, and the request/response shapes of Read, Trim
and the AdminService. No I/O here, so each client is a thin call site."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta, timezone

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from .records import (
    BusyKey,
    ConsumerInfo,
    DeadLetterEntry,
    DeadLetterPage,
    Entry,
    GroupInfo,
    ReadPage,
    Replayed,
    ReplayResult,
    ScheduledEntry,
    ScheduledPage,
    TrimResult,
)
from .delivery import RawField, payload_dict
from .v1 import admin_service_pb2 as admin_pb
from .v1 import stream_service_pb2 as stream_pb
from .v1 import types_pb2 as types_pb

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

#: A bound of a range: a stream id (`<ms>-<seq>` or `<ms>`) or an instant.
Bound = str | datetime


def utc(instant: datetime) -> datetime:
    """`instant` as an aware UTC datetime (a naive one is taken as UTC)."""
    return instant.replace(tzinfo=timezone.utc) if instant.tzinfo is None else instant.astimezone(timezone.utc)


def to_timestamp(instant: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(utc(instant))
    return stamp


def from_timestamp(stamp: Timestamp) -> datetime:
    return _EPOCH + timedelta(seconds=stamp.seconds, microseconds=stamp.nanos // 1000)


def from_duration(duration: Duration) -> timedelta:
    return timedelta(seconds=duration.seconds, microseconds=duration.nanos // 1000)


def entry(message: types_pb.Entry) -> Entry:
    return Entry(
        id=message.id,
        stream_id=message.stream_id,
        payload=payload_dict(message.payload),
        minted_at=from_timestamp(message.minted_at),
        raw_fields=[RawField(f.name, f.value) for f in message.raw_fields],
        traceparent=message.traceparent,
    )


# -- StreamService.Read and Trim ------------------------------------------------


def read_request(stream: str, start: Bound | None, end: Bound | None, count: int) -> stream_pb.ReadRequest:
    if not stream:
        raise ValueError("stream is required")
    if not 0 <= count <= 10_000:
        raise ValueError("count must be between 0 (the sidecar's 100) and 10,000 entries")
    request = stream_pb.ReadRequest(stream=stream, count=count)
    if isinstance(start, datetime):
        request.start_time.CopyFrom(to_timestamp(start))
    elif start:
        request.start_id = start
    if isinstance(end, datetime):
        request.end_time.CopyFrom(to_timestamp(end))
    elif end:
        request.end_id = end
    return request


def read_page(response: stream_pb.ReadResponse) -> ReadPage:
    return ReadPage(
        entries=[entry(e) for e in response.entries],
        next_start_id=response.next_start_id or None,
        oversized_ids=list(response.oversized_ids),
    )


def trim_request(
    stream: str,
    max_len: int | None,
    min_id: str | None,
    before: datetime | None,
    approximate: bool,
    ignore_groups: bool,
) -> stream_pb.TrimRequest:
    if not stream:
        raise ValueError("stream is required")
    if sum(bound is not None for bound in (max_len, min_id, before)) != 1:
        raise ValueError("give exactly one of max_len, min_id and before")
    request = stream_pb.TrimRequest(stream=stream, approximate=approximate, ignore_groups=ignore_groups)
    if max_len is not None:
        if max_len < 1:
            raise ValueError("max_len must be at least 1 (to remove everything, give min_id past the last entry)")
        request.max_len = max_len
    elif min_id is not None:
        if not min_id:
            raise ValueError("min_id must be a stream id")
        request.min_id = min_id
    else:
        assert before is not None
        request.before.CopyFrom(to_timestamp(before))
    return request


def trimmed(response: stream_pb.TrimResponse) -> TrimResult:
    return TrimResult(
        trimmed=response.trimmed,
        applied_min_id=response.applied_min_id or None,
        held_back_by_groups=response.held_back_by_groups,
    )


# -- AdminService -----------------------------------------------------------------


def describe_request(stream: str, group: str) -> admin_pb.DescribeGroupRequest:
    if not stream or not group:
        raise ValueError("stream and group are required")
    return admin_pb.DescribeGroupRequest(stream=stream, group=group)


def group_info(message: admin_pb.DescribeGroupResponse) -> GroupInfo:
    return GroupInfo(
        stream=message.stream,
        group=message.group,
        pending=message.pending,
        lag=message.lag if message.HasField("lag") else None,
        last_delivered_id=message.last_delivered_id,
        consumers=[ConsumerInfo(c.name, c.pending, from_duration(c.idle)) for c in message.consumers],
        oldest_pending_id=message.oldest_pending_id or None,
        oldest_pending_age=(
            from_duration(message.oldest_pending_age) if message.HasField("oldest_pending_age") else None
        ),
        max_delivery_count=message.max_delivery_count,
        stream_length=message.stream_length,
        shards=[group_info(s) for s in message.shards],
        keyed_entries=message.keyed_entries,
        busy_keys=[BusyKey(k.key, k.entries, k.head_id, k.head_consumer) for k in message.busy_keys],
    )


def _page_count(count: int) -> int:
    if not 0 <= count <= 10_000:
        raise ValueError("count must be between 0 (the sidecar's 100) and 10,000")
    return count


def list_dead_letters_request(
    stream: str, dead_letter_stream: str | None, start_id: str | None, count: int
) -> admin_pb.ListDeadLettersRequest:
    if not stream and not dead_letter_stream:
        raise ValueError("give stream, dead_letter_stream, or both")
    return admin_pb.ListDeadLettersRequest(
        stream=stream, dead_letter_stream=dead_letter_stream or "", start_id=start_id or "", count=_page_count(count)
    )


def dead_letter_page(response: admin_pb.ListDeadLettersResponse) -> DeadLetterPage:
    return DeadLetterPage(
        dead_letters=[
            DeadLetterEntry(
                entry=entry(d.entry),
                source_stream=d.source_stream,
                source_id=d.source_id,
                group=d.group,
                attempts=d.attempts,
                reason=d.reason,
                dead_lettered_at=from_timestamp(d.dead_lettered_at),
            )
            for d in response.dead_letters
        ],
        next_start_id=response.next_start_id or None,
        oversized_ids=list(response.oversized_ids),
    )


def replay_request(
    stream: str, ids: Iterable[str], dead_letter_stream: str | None, count: int
) -> admin_pb.ReplayDeadLettersRequest:
    if not stream:
        raise ValueError("stream (the source the entries go back to) is required")
    return admin_pb.ReplayDeadLettersRequest(
        stream=stream, dead_letter_stream=dead_letter_stream or "", ids=list(ids), count=_page_count(count)
    )


def replay_result(response: admin_pb.ReplayDeadLettersResponse) -> ReplayResult:
    return ReplayResult(
        replayed=[Replayed(r.id, r.dead_letter_id, r.stream_id) for r in response.replayed],
        not_found_ids=list(response.not_found_ids),
        other_source_ids=list(response.other_source_ids),
    )


def scheduled_page(response: stream_pb.ListScheduledResponse) -> ScheduledPage:
    return ScheduledPage(
        entries=[
            ScheduledEntry(id=e.id, deliver_at=from_timestamp(e.deliver_at), fields=dict(e.fields))
            for e in response.entries
        ],
        next_page_token=response.next_page_token or None,
        total=response.total,
    )
