from echomq.v1 import types_pb2 as _types_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DescribeGroupRequest(_message.Message):
    __slots__ = ("stream", "group")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class ConsumerInfo(_message.Message):
    __slots__ = ("name", "pending", "idle")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    pending: int
    idle: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., pending: _Optional[int] = ..., idle: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class DescribeGroupResponse(_message.Message):
    __slots__ = ("stream", "group", "pending", "lag", "last_delivered_id", "consumers", "oldest_pending_id", "oldest_pending_age", "max_delivery_count", "stream_length", "shards", "archive", "scheduled", "oldest_scheduled_due", "keyed_entries", "busy_keys")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    LAST_DELIVERED_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_PENDING_ID_FIELD_NUMBER: _ClassVar[int]
    OLDEST_PENDING_AGE_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    STREAM_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_SCHEDULED_DUE_FIELD_NUMBER: _ClassVar[int]
    KEYED_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BUSY_KEYS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    pending: int
    lag: int
    last_delivered_id: str
    consumers: _containers.RepeatedCompositeFieldContainer[ConsumerInfo]
    oldest_pending_id: str
    oldest_pending_age: _duration_pb2.Duration
    max_delivery_count: int
    stream_length: int
    shards: _containers.RepeatedCompositeFieldContainer[DescribeGroupResponse]
    archive: ArchiveInfo
    scheduled: int
    oldest_scheduled_due: _timestamp_pb2.Timestamp
    keyed_entries: int
    busy_keys: _containers.RepeatedCompositeFieldContainer[BusyKey]
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., pending: _Optional[int] = ..., lag: _Optional[int] = ..., last_delivered_id: _Optional[str] = ..., consumers: _Optional[_Iterable[_Union[ConsumerInfo, _Mapping]]] = ..., oldest_pending_id: _Optional[str] = ..., oldest_pending_age: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., max_delivery_count: _Optional[int] = ..., stream_length: _Optional[int] = ..., shards: _Optional[_Iterable[_Union[DescribeGroupResponse, _Mapping]]] = ..., archive: _Optional[_Union[ArchiveInfo, _Mapping]] = ..., scheduled: _Optional[int] = ..., oldest_scheduled_due: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., keyed_entries: _Optional[int] = ..., busy_keys: _Optional[_Iterable[_Union[BusyKey, _Mapping]]] = ...) -> None: ...

class BusyKey(_message.Message):
    __slots__ = ("key", "entries", "head_id", "head_consumer")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    HEAD_ID_FIELD_NUMBER: _ClassVar[int]
    HEAD_CONSUMER_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    entries: int
    head_id: str
    head_consumer: str
    def __init__(self, key: _Optional[bytes] = ..., entries: _Optional[int] = ..., head_id: _Optional[str] = ..., head_consumer: _Optional[str] = ...) -> None: ...

class ArchiveInfo(_message.Message):
    __slots__ = ("oldest_id", "archived_through", "entries", "files", "bytes", "last_error")
    OLDEST_ID_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_THROUGH_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    oldest_id: str
    archived_through: str
    entries: int
    files: int
    bytes: int
    last_error: str
    def __init__(self, oldest_id: _Optional[str] = ..., archived_through: _Optional[str] = ..., entries: _Optional[int] = ..., files: _Optional[int] = ..., bytes: _Optional[int] = ..., last_error: _Optional[str] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("stream", "dead_letter_stream", "start_id", "count")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_STREAM_FIELD_NUMBER: _ClassVar[int]
    START_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    stream: str
    dead_letter_stream: str
    start_id: str
    count: int
    def __init__(self, stream: _Optional[str] = ..., dead_letter_stream: _Optional[str] = ..., start_id: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("entry", "source_stream", "source_id", "group", "attempts", "reason", "dead_lettered_at")
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_STREAM_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_AT_FIELD_NUMBER: _ClassVar[int]
    entry: _types_pb2.Entry
    source_stream: str
    source_id: str
    group: str
    attempts: int
    reason: str
    dead_lettered_at: _timestamp_pb2.Timestamp
    def __init__(self, entry: _Optional[_Union[_types_pb2.Entry, _Mapping]] = ..., source_stream: _Optional[str] = ..., source_id: _Optional[str] = ..., group: _Optional[str] = ..., attempts: _Optional[int] = ..., reason: _Optional[str] = ..., dead_lettered_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ("dead_letters", "next_start_id", "oversized_ids")
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_START_ID_FIELD_NUMBER: _ClassVar[int]
    OVERSIZED_IDS_FIELD_NUMBER: _ClassVar[int]
    dead_letters: _containers.RepeatedCompositeFieldContainer[DeadLetter]
    next_start_id: str
    oversized_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, dead_letters: _Optional[_Iterable[_Union[DeadLetter, _Mapping]]] = ..., next_start_id: _Optional[str] = ..., oversized_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReplayDeadLettersRequest(_message.Message):
    __slots__ = ("stream", "dead_letter_stream", "ids", "count")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_STREAM_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    stream: str
    dead_letter_stream: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    count: int
    def __init__(self, stream: _Optional[str] = ..., dead_letter_stream: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., count: _Optional[int] = ...) -> None: ...

class Replayed(_message.Message):
    __slots__ = ("id", "dead_letter_id", "stream_id")
    ID_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    dead_letter_id: str
    stream_id: str
    def __init__(self, id: _Optional[str] = ..., dead_letter_id: _Optional[str] = ..., stream_id: _Optional[str] = ...) -> None: ...

class ReplayDeadLettersResponse(_message.Message):
    __slots__ = ("replayed", "not_found_ids", "other_source_ids")
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    NOT_FOUND_IDS_FIELD_NUMBER: _ClassVar[int]
    OTHER_SOURCE_IDS_FIELD_NUMBER: _ClassVar[int]
    replayed: _containers.RepeatedCompositeFieldContainer[Replayed]
    not_found_ids: _containers.RepeatedScalarFieldContainer[str]
    other_source_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replayed: _Optional[_Iterable[_Union[Replayed, _Mapping]]] = ..., not_found_ids: _Optional[_Iterable[str]] = ..., other_source_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DestroyGroupRequest(_message.Message):
    __slots__ = ("stream", "group", "force")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    force: bool
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., force: bool = ...) -> None: ...

class DestroyGroupResponse(_message.Message):
    __slots__ = ("stream", "group", "pending_dropped", "keys_removed")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PENDING_DROPPED_FIELD_NUMBER: _ClassVar[int]
    KEYS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    pending_dropped: int
    keys_removed: int
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., pending_dropped: _Optional[int] = ..., keys_removed: _Optional[int] = ...) -> None: ...
