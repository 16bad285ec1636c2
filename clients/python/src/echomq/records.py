"""What Read, Trim and the AdminService answer, as plain immutable values.

Shapes and units follow `proto/echomq/v1`; durations are `timedelta`,
instants aware UTC `datetime`s, and a field the proto leaves empty or unset
when there is nothing to say is `None`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ._deprecation import renamed_attributes
from .delivery import RawField


@dataclass(frozen=True)
class Entry:
    """One stream entry, outside any group (Read, dead letters)."""

    #: The branded id, 28 lowercase hex characters (from the reserved field,
    #: else derived from the stream id): the idempotency key.
    id: str
    #: The entry's id in the stream read, `<ms>-<seq>`.
    stream_id: str
    #: Field name → value, without the reserved branded-id field.
    payload: dict[str, bytes]
    #: When the branded id was minted (UTC, millisecond precision).
    minted_at: datetime
    #: Fields whose names are not valid UTF-8, byte for byte. Usually empty.
    raw_fields: list[RawField] = field(default_factory=list)
    #: The W3C trace context stored with the entry, or "".
    traceparent: str = ""


@dataclass(frozen=True)
class ReadPage:
    """One page of `Streams.read`."""

    #: Oldest first.
    entries: list[Entry]
    #: Pass as `start` for the next page (same end bound); None when this
    #: page reached the end of the range. A page may hold fewer entries than
    #: asked when more would not fit in one gRPC message.
    next_start_id: str | None
    #: Stream ids in this page's range too large for one gRPC message on
    #: their own: left out (read them with XRANGE).
    oversized_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TrimResult:
    """What `Streams.trim` did."""

    #: Entries removed.
    trimmed: int
    #: The MINID bound applied (entries below it are gone); None when nothing
    #: could be trimmed.
    applied_min_id: str | None
    #: True when the safe mode raised the bound to spare entries a group
    #: still has pending or has not read yet.
    held_back_by_groups: bool


@dataclass(frozen=True)
class ConsumerInfo:
    """One consumer of a group."""

    #: The consumer name (a sidecar's `--consumer-name`).
    name: str
    #: Entries in its PEL.
    pending: int
    #: Time since it last read or claimed.
    idle: timedelta


@dataclass(frozen=True)
class BusyKey:
    """A key of a group with per-key limits (`Consumer(key_field=...)`)
    that has entries pending (`GroupInfo.busy_keys`)."""

    #: The key: the value of the group's key field, as stored (bytes).
    key: bytes
    #: Its entries pending in the group, held or waiting for the key.
    entries: int
    #: The stream id of its oldest pending entry: the one that runs first.
    head_id: str
    #: The consumer whose PEL holds that entry.
    head_consumer: str


@dataclass(frozen=True)
class GroupInfo:
    """A consumer group's state (`Admin.describe_group`)."""

    stream: str
    group: str
    #: Entries delivered and not yet acknowledged (the PEL's size).
    pending: int
    #: Entries appended that the group has not read yet; None when Redis
    #: cannot say (after XDEL or trimming in some cases, before Redis 7.0).
    lag: int | None
    #: The group's last-delivered stream id ("" for a sharded stream's sum).
    last_delivered_id: str
    consumers: list[ConsumerInfo]
    #: The oldest pending entry's stream id; None when nothing is pending.
    oldest_pending_id: str | None
    #: How long ago the oldest pending entry was appended; None when nothing is pending.
    oldest_pending_age: timedelta | None
    #: The highest delivery count among the oldest 10,000 pending entries.
    max_delivery_count: int
    #: Entries in the stream (XLEN).
    stream_length: int
    #: For a sharded stream, each shard's state (the fields above are the
    #: sums); empty for a plain stream.
    shards: list[GroupInfo] = field(default_factory=list)
    #: Per-key limits (`Consumer(key_field=...)`): the group's pending entries
    #: that hold or wait for their key; 0 when the group has no key field.
    keyed_entries: int = 0
    #: The keys with entries held or waiting, the busiest first: at most 100,
    #: from the first 10,000 keyed entries.
    busy_keys: list[BusyKey] = field(default_factory=list)


@dataclass(frozen=True)
class DeadLetterEntry:
    """One dead letter (`Admin.list_dead_letters`)."""

    #: The entry as it sits in the dead-letter stream: `entry.id` is the
    #: original branded id, `entry.stream_id` its dead-letter stream id (what
    #: `Admin.replay_dead_letters(ids=...)` takes), `entry.payload` the
    #: original payload without the `echomq.*` metadata.
    entry: Entry
    #: The stream it came from.
    source_stream: str
    #: Its stream id in the source stream.
    source_id: str
    #: The group that gave up on it.
    group: str
    #: Its delivery count when it was dead-lettered.
    attempts: int
    #: The last failure reason.
    reason: str
    #: When it was dead-lettered (UTC).
    dead_lettered_at: datetime


@dataclass(frozen=True)
class DeadLetterPage:
    """One page of `Admin.list_dead_letters`."""

    #: Oldest first.
    dead_letters: list[DeadLetterEntry]
    #: Pass as `start_id` for the next page; None at the end.
    next_start_id: str | None
    #: Dead-letter stream ids too large for one gRPC message: left out
    #: (replaying them still works).
    oversized_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Replayed:
    """One dead letter moved back to its source stream."""

    #: The branded id, unchanged.
    id: str
    #: The id it had in the dead-letter stream.
    dead_letter_id: str
    #: Its new stream id in the source stream.
    stream_id: str


@dataclass(frozen=True)
class ReplayResult:
    """What `Admin.replay_dead_letters` did, in order."""

    replayed: list[Replayed]
    #: Requested ids not in the dead-letter stream (already replayed, or never there).
    not_found_ids: list[str] = field(default_factory=list)
    #: Dead letters whose source is another stream sharing this dead-letter
    #: stream: left in place (replay them by naming that stream).
    other_source_ids: list[str] = field(default_factory=list)


#: Old names: `Trimmed` (now `TrimResult`).
__getattr__ = renamed_attributes("echomq.records", {"Trimmed": ("echomq.TrimResult", lambda: TrimResult)})


@dataclass(frozen=True)
class ScheduledEntry:
    """An entry scheduled with `deliver_at` or `delay` that has not entered
    its stream yet (`Streams.list_scheduled`)."""

    #: Its branded id, as the append answered it.
    id: str
    #: When it is due to enter the stream (UTC).
    deliver_at: datetime
    #: Its fields, as appended (with the stored `traceparent`, if any).
    fields: dict[str, bytes]


@dataclass(frozen=True)
class ScheduledPage:
    """One page of `Streams.list_scheduled`."""

    #: Due first first (then by branded id).
    entries: list[ScheduledEntry]
    #: Pass as `page_token` for the next page; None after the last.
    next_page_token: str | None
    #: How many entries the stream key has scheduled in all.
    total: int
