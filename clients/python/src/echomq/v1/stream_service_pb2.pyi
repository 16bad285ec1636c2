from echomq.v1 import types_pb2 as _types_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReadRequest(_message.Message):
    __slots__ = ("stream", "start_id", "start_time", "end_id", "end_time", "count")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    START_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_ID_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    stream: str
    start_id: str
    start_time: _timestamp_pb2.Timestamp
    end_id: str
    end_time: _timestamp_pb2.Timestamp
    count: int
    def __init__(self, stream: _Optional[str] = ..., start_id: _Optional[str] = ..., start_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., end_id: _Optional[str] = ..., end_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., count: _Optional[int] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("entries", "next_start_id", "oversized_ids")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_START_ID_FIELD_NUMBER: _ClassVar[int]
    OVERSIZED_IDS_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_types_pb2.Entry]
    next_start_id: str
    oversized_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entries: _Optional[_Iterable[_Union[_types_pb2.Entry, _Mapping]]] = ..., next_start_id: _Optional[str] = ..., oversized_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class TrimRequest(_message.Message):
    __slots__ = ("stream", "max_len", "min_id", "before", "approximate", "ignore_groups")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    MIN_ID_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    APPROXIMATE_FIELD_NUMBER: _ClassVar[int]
    IGNORE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    max_len: int
    min_id: str
    before: _timestamp_pb2.Timestamp
    approximate: bool
    ignore_groups: bool
    def __init__(self, stream: _Optional[str] = ..., max_len: _Optional[int] = ..., min_id: _Optional[str] = ..., before: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., approximate: bool = ..., ignore_groups: bool = ...) -> None: ...

class TrimResponse(_message.Message):
    __slots__ = ("trimmed", "applied_min_id", "held_back_by_groups", "archived")
    TRIMMED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_MIN_ID_FIELD_NUMBER: _ClassVar[int]
    HELD_BACK_BY_GROUPS_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_FIELD_NUMBER: _ClassVar[int]
    trimmed: int
    applied_min_id: str
    held_back_by_groups: bool
    archived: int
    def __init__(self, trimmed: _Optional[int] = ..., applied_min_id: _Optional[str] = ..., held_back_by_groups: bool = ..., archived: _Optional[int] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("stream", "fields", "max_len", "partition_key", "dedup_key", "deliver_at", "delay")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    STREAM_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEY_FIELD_NUMBER: _ClassVar[int]
    DEDUP_KEY_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    stream: str
    fields: _containers.ScalarMap[str, bytes]
    max_len: int
    partition_key: str
    dedup_key: str
    deliver_at: _timestamp_pb2.Timestamp
    delay: _duration_pb2.Duration
    def __init__(self, stream: _Optional[str] = ..., fields: _Optional[_Mapping[str, bytes]] = ..., max_len: _Optional[int] = ..., partition_key: _Optional[str] = ..., dedup_key: _Optional[str] = ..., deliver_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., delay: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("id", "stream_id", "stream", "duplicate", "scheduled")
    ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    id: str
    stream_id: str
    stream: str
    duplicate: bool
    scheduled: bool
    def __init__(self, id: _Optional[str] = ..., stream_id: _Optional[str] = ..., stream: _Optional[str] = ..., duplicate: bool = ..., scheduled: bool = ...) -> None: ...

class AppendBatchRequest(_message.Message):
    __slots__ = ("stream", "entries", "max_len", "partition_key")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEY_FIELD_NUMBER: _ClassVar[int]
    stream: str
    entries: _containers.RepeatedCompositeFieldContainer[BatchEntry]
    max_len: int
    partition_key: str
    def __init__(self, stream: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[BatchEntry, _Mapping]]] = ..., max_len: _Optional[int] = ..., partition_key: _Optional[str] = ...) -> None: ...

class BatchEntry(_message.Message):
    __slots__ = ("fields", "dedup_key", "deliver_at", "delay")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    DEDUP_KEY_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.ScalarMap[str, bytes]
    dedup_key: str
    deliver_at: _timestamp_pb2.Timestamp
    delay: _duration_pb2.Duration
    def __init__(self, fields: _Optional[_Mapping[str, bytes]] = ..., dedup_key: _Optional[str] = ..., deliver_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., delay: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class AppendBatchResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AppendResponse]
    def __init__(self, entries: _Optional[_Iterable[_Union[AppendResponse, _Mapping]]] = ...) -> None: ...

class CancelScheduledRequest(_message.Message):
    __slots__ = ("stream", "id")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    stream: str
    id: str
    def __init__(self, stream: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class CancelScheduledResponse(_message.Message):
    __slots__ = ("deliver_at",)
    DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    deliver_at: _timestamp_pb2.Timestamp
    def __init__(self, deliver_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListScheduledRequest(_message.Message):
    __slots__ = ("stream", "page_token", "count")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    stream: str
    page_token: str
    count: int
    def __init__(self, stream: _Optional[str] = ..., page_token: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class ScheduledEntry(_message.Message):
    __slots__ = ("id", "deliver_at", "fields")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    deliver_at: _timestamp_pb2.Timestamp
    fields: _containers.ScalarMap[str, bytes]
    def __init__(self, id: _Optional[str] = ..., deliver_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., fields: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class ListScheduledResponse(_message.Message):
    __slots__ = ("entries", "next_page_token", "total")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[ScheduledEntry]
    next_page_token: str
    total: int
    def __init__(self, entries: _Optional[_Iterable[_Union[ScheduledEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., total: _Optional[int] = ...) -> None: ...
