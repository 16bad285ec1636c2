"""Value types for the consumer's settings: where a group starts, and the
reconnect backoff."""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import ClassVar

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from .v1 import consumer_service_pb2 as pb

#: A duration: seconds as a number, or a `timedelta`.
Seconds = float | int | timedelta


def seconds(value: Seconds) -> float:
    """A duration in seconds as a float."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def to_duration(value: Seconds) -> Duration:
    """A duration as a `google.protobuf.Duration`.

    Raises ValueError for infinity or NaN (no Duration holds them)."""
    total = seconds(value)
    if not math.isfinite(total):
        raise ValueError(f"a duration must be a finite number of seconds, got {value!r}")
    whole = int(total // 1)
    nanos = int(round((total - whole) * 1e9))
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    if whole < 0 < nanos:  # protobuf wants seconds and nanos of the same sign
        whole, nanos = whole + 1, nanos - 1_000_000_000
    return Duration(seconds=whole, nanos=nanos)


class StartKind(enum.Enum):
    """Where a new group starts; mirrors `echomq.v1.GroupStart`."""

    NEW = pb.GROUP_START_NEW
    BEGINNING = pb.GROUP_START_BEGINNING
    ID = pb.GROUP_START_ID
    INSTANT = pb.GROUP_START_INSTANT


@dataclass(frozen=True)
class Start:
    """Where the group starts reading if the subscription has to create it.

    There is deliberately no default: guessing wrong either skips or replays a
    whole stream. Ignored when the group already exists (it keeps its position).

    - `Start.NEW`: only entries appended after the group is created (`$`);
    - `Start.BEGINNING`: everything the stream holds, oldest first (`0`);
    - `Start.after("1718000000000-3")`: entries after that stream id;
    - `Start.at(datetime)`: entries appended at or after that instant.
    """

    kind: StartKind
    stream_id: str = ""
    instant: datetime | None = None

    #: Only entries appended after the group is created (set below the class).
    NEW: ClassVar[Start]
    #: Everything the stream holds, oldest first (set below the class).
    BEGINNING: ClassVar[Start]

    @classmethod
    def after(cls, stream_id: str) -> Start:
        """Entries after `stream_id` (`<ms>-<seq>` or `<ms>`), exclusive."""
        if not stream_id:
            raise ValueError("Start.after needs a stream id such as '1718000000000-0'")
        return cls(StartKind.ID, stream_id=stream_id)

    @classmethod
    def at(cls, instant: datetime) -> Start:
        """Entries appended at or after `instant` (a naive datetime is taken as UTC)."""
        if instant.tzinfo is None:
            instant = instant.replace(tzinfo=timezone.utc)
        return cls(StartKind.INSTANT, instant=instant)

    def apply(self, subscribe: pb.Subscribe) -> None:
        """Writes this start into a Subscribe message."""
        subscribe.group_start = self.kind.value
        if self.kind is StartKind.ID:
            subscribe.start_id = self.stream_id
        elif self.kind is StartKind.INSTANT:
            assert self.instant is not None
            stamp = Timestamp()
            stamp.FromDatetime(self.instant.astimezone(timezone.utc))
            subscribe.start_time.CopyFrom(stamp)


Start.NEW = Start(StartKind.NEW)
Start.BEGINNING = Start(StartKind.BEGINNING)


@dataclass(frozen=True)
class Backoff:
    """Jittered exponential backoff between reconnect attempts.

    The n-th consecutive failure (from 0) waits a random time between half and
    all of `min(maximum, initial * multiplier**n)` seconds ("equal jitter": never
    zero, and peers that broke together do not come back together). A call that
    got as far as a successful subscribe resets the count.
    """

    initial: float = 0.1
    maximum: float = 5.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial or self.multiplier < 1:
            raise ValueError("Backoff needs 0 < initial <= maximum and multiplier >= 1")

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """The wait (seconds) before reconnect attempt number `failures` + 1."""
        ceiling = min(self.maximum, self.initial * self.multiplier ** min(failures, 64))
        return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)


@dataclass(frozen=True)
class FlowControl:
    """How much a consumer takes on at once, grouped as google-cloud-pubsub's
    `FlowControl` groups its outstanding-message limits::

        Consumer(target, "orders", "billing", handle, start=Start.BEGINNING,
                 flow_control=FlowControl(max_in_flight=128, concurrency=16))

    - `max_in_flight` (entries): the most deliveries the sidecar hands the
      consumer un-settled, fixed (pubsub's `max_messages`). None (sent as 0):
      an adaptive window of 64 up to the sidecar's cap
      (`--default-max-in-flight`, 1024 by default), which grows while the
      handlers keep up and shrinks (down to 8) when they fall behind; the
      cap comes back in `Subscription.max_in_flight`, and bounds what the
      client buffers (cap × entry size).
    - `concurrency`: the most handler calls running at once (a fixed pool of
      that many workers). None: `max_in_flight` when that is given, else 64
      (`DEFAULT_CONCURRENCY`, at most the sidecar's cap) for a handler; 1
      for a batch handler; at most `max_in_flight` when that is given.
    - `max_batch` (deliveries): the most per frame the sidecar sends, and the
      largest list a batch handler gets. None: `min(256, max_in_flight)`
      (256, a quarter of the default cap, when `max_in_flight` is unset); at
      most 4096.

    There is no byte bound: the protocol counts entries, not bytes.
    """

    max_in_flight: int | None = None
    concurrency: int | None = None
    max_batch: int | None = None

