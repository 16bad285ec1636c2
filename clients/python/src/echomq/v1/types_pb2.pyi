from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Entry(_message.Message):
    __slots__ = ("id", "stream_id", "payload", "minted_at", "raw_fields", "traceparent", "archived")
    class PayloadEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    MINTED_AT_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELDS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    ARCHIVED_FIELD_NUMBER: _ClassVar[int]
    id: str
    stream_id: str
    payload: _containers.ScalarMap[str, bytes]
    minted_at: _timestamp_pb2.Timestamp
    raw_fields: _containers.RepeatedCompositeFieldContainer[RawField]
    traceparent: str
    archived: bool
    def __init__(self, id: _Optional[str] = ..., stream_id: _Optional[str] = ..., payload: _Optional[_Mapping[str, bytes]] = ..., minted_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., raw_fields: _Optional[_Iterable[_Union[RawField, _Mapping]]] = ..., traceparent: _Optional[str] = ..., archived: bool = ...) -> None: ...

class RawField(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: bytes
    value: bytes
    def __init__(self, name: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...
