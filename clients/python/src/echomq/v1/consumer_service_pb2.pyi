from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from echomq.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GroupStart(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GROUP_START_UNSPECIFIED: _ClassVar[GroupStart]
    GROUP_START_NEW: _ClassVar[GroupStart]
    GROUP_START_BEGINNING: _ClassVar[GroupStart]
    GROUP_START_ID: _ClassVar[GroupStart]
    GROUP_START_INSTANT: _ClassVar[GroupStart]

class FailKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAIL_KIND_UNSPECIFIED: _ClassVar[FailKind]
    FAIL_KIND_MESSAGE: _ClassVar[FailKind]
    FAIL_KIND_TRANSIENT: _ClassVar[FailKind]
    FAIL_KIND_POISON: _ClassVar[FailKind]

class VerdictErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_ERROR_CODE_UNSPECIFIED: _ClassVar[VerdictErrorCode]
    VERDICT_ERROR_CODE_UNKNOWN_ID: _ClassVar[VerdictErrorCode]
    VERDICT_ERROR_CODE_NOT_PENDING: _ClassVar[VerdictErrorCode]
    VERDICT_ERROR_CODE_INVALID_ARGUMENT: _ClassVar[VerdictErrorCode]
    VERDICT_ERROR_CODE_UNAVAILABLE: _ClassVar[VerdictErrorCode]
    VERDICT_ERROR_CODE_LEASE_LOST: _ClassVar[VerdictErrorCode]
    VERDICT_ERROR_CODE_PERMISSION_DENIED: _ClassVar[VerdictErrorCode]
GROUP_START_UNSPECIFIED: GroupStart
GROUP_START_NEW: GroupStart
GROUP_START_BEGINNING: GroupStart
GROUP_START_ID: GroupStart
GROUP_START_INSTANT: GroupStart
FAIL_KIND_UNSPECIFIED: FailKind
FAIL_KIND_MESSAGE: FailKind
FAIL_KIND_TRANSIENT: FailKind
FAIL_KIND_POISON: FailKind
VERDICT_ERROR_CODE_UNSPECIFIED: VerdictErrorCode
VERDICT_ERROR_CODE_UNKNOWN_ID: VerdictErrorCode
VERDICT_ERROR_CODE_NOT_PENDING: VerdictErrorCode
VERDICT_ERROR_CODE_INVALID_ARGUMENT: VerdictErrorCode
VERDICT_ERROR_CODE_UNAVAILABLE: VerdictErrorCode
VERDICT_ERROR_CODE_LEASE_LOST: VerdictErrorCode
VERDICT_ERROR_CODE_PERMISSION_DENIED: VerdictErrorCode

class ConsumeRequest(_message.Message):
    __slots__ = ("subscribe", "ack", "fail", "extend", "drain", "release", "ack_emit")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    FAIL_FIELD_NUMBER: _ClassVar[int]
    EXTEND_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    ACK_EMIT_FIELD_NUMBER: _ClassVar[int]
    subscribe: Subscribe
    ack: Ack
    fail: Fail
    extend: Extend
    drain: Drain
    release: Release
    ack_emit: AckEmit
    def __init__(self, subscribe: _Optional[_Union[Subscribe, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., fail: _Optional[_Union[Fail, _Mapping]] = ..., extend: _Optional[_Union[Extend, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ..., release: _Optional[_Union[Release, _Mapping]] = ..., ack_emit: _Optional[_Union[AckEmit, _Mapping]] = ...) -> None: ...

class Subscribe(_message.Message):
    __slots__ = ("stream", "group", "group_start", "start_id", "start_time", "max_in_flight", "ack_deadline", "retry_backoff_initial", "retry_backoff_max", "dead_letter_stream", "max_deliveries", "no_ack", "max_batch", "key_field", "max_in_flight_per_key")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    GROUP_START_FIELD_NUMBER: _ClassVar[int]
    START_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ACK_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    RETRY_BACKOFF_INITIAL_FIELD_NUMBER: _ClassVar[int]
    RETRY_BACKOFF_MAX_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_STREAM_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    NO_ACK_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_PER_KEY_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    group_start: GroupStart
    start_id: str
    start_time: _timestamp_pb2.Timestamp
    max_in_flight: int
    ack_deadline: _duration_pb2.Duration
    retry_backoff_initial: _duration_pb2.Duration
    retry_backoff_max: _duration_pb2.Duration
    dead_letter_stream: str
    max_deliveries: int
    no_ack: bool
    max_batch: int
    key_field: str
    max_in_flight_per_key: int
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., group_start: _Optional[_Union[GroupStart, str]] = ..., start_id: _Optional[str] = ..., start_time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., max_in_flight: _Optional[int] = ..., ack_deadline: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., retry_backoff_initial: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., retry_backoff_max: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., dead_letter_stream: _Optional[str] = ..., max_deliveries: _Optional[int] = ..., no_ack: bool = ..., max_batch: _Optional[int] = ..., key_field: _Optional[str] = ..., max_in_flight_per_key: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Fail(_message.Message):
    __slots__ = ("id", "reason", "retry_after", "dead_letter", "kind")
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    id: str
    reason: str
    retry_after: _duration_pb2.Duration
    dead_letter: bool
    kind: FailKind
    def __init__(self, id: _Optional[str] = ..., reason: _Optional[str] = ..., retry_after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., dead_letter: bool = ..., kind: _Optional[_Union[FailKind, str]] = ...) -> None: ...

class AckEmit(_message.Message):
    __slots__ = ("id", "emits")
    ID_FIELD_NUMBER: _ClassVar[int]
    EMITS_FIELD_NUMBER: _ClassVar[int]
    id: str
    emits: _containers.RepeatedCompositeFieldContainer[Emit]
    def __init__(self, id: _Optional[str] = ..., emits: _Optional[_Iterable[_Union[Emit, _Mapping]]] = ...) -> None: ...

class Emit(_message.Message):
    __slots__ = ("stream", "fields")
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    STREAM_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    fields: _containers.ScalarMap[str, bytes]
    def __init__(self, stream: _Optional[str] = ..., fields: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class Extend(_message.Message):
    __slots__ = ("ids", "by")
    IDS_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    by: _duration_pb2.Duration
    def __init__(self, ids: _Optional[_Iterable[str]] = ..., by: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Release(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ConsumeResponse(_message.Message):
    __slots__ = ("subscribed", "delivery", "verdict_error", "batch", "emitted")
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    VERDICT_ERROR_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    EMITTED_FIELD_NUMBER: _ClassVar[int]
    subscribed: Subscribed
    delivery: Delivery
    verdict_error: VerdictError
    batch: DeliveryBatch
    emitted: Emitted
    def __init__(self, subscribed: _Optional[_Union[Subscribed, _Mapping]] = ..., delivery: _Optional[_Union[Delivery, _Mapping]] = ..., verdict_error: _Optional[_Union[VerdictError, _Mapping]] = ..., batch: _Optional[_Union[DeliveryBatch, _Mapping]] = ..., emitted: _Optional[_Union[Emitted, _Mapping]] = ...) -> None: ...

class Emitted(_message.Message):
    __slots__ = ("id", "entries")
    ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    id: str
    entries: _containers.RepeatedCompositeFieldContainer[EmittedEntry]
    def __init__(self, id: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[EmittedEntry, _Mapping]]] = ...) -> None: ...

class EmittedEntry(_message.Message):
    __slots__ = ("id", "stream_id", "stream")
    ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    id: str
    stream_id: str
    stream: str
    def __init__(self, id: _Optional[str] = ..., stream_id: _Optional[str] = ..., stream: _Optional[str] = ...) -> None: ...

class DeliveryBatch(_message.Message):
    __slots__ = ("deliveries",)
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ...) -> None: ...

class Subscribed(_message.Message):
    __slots__ = ("stream", "group", "consumer", "max_in_flight")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    consumer: str
    max_in_flight: int
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., consumer: _Optional[str] = ..., max_in_flight: _Optional[int] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("id", "stream_id", "stream", "group", "payload", "attempts", "minted_at", "traceparent", "raw_fields")
    class PayloadEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MINTED_AT_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    stream_id: str
    stream: str
    group: str
    payload: _containers.ScalarMap[str, bytes]
    attempts: int
    minted_at: _timestamp_pb2.Timestamp
    traceparent: str
    raw_fields: _containers.RepeatedCompositeFieldContainer[_types_pb2.RawField]
    def __init__(self, id: _Optional[str] = ..., stream_id: _Optional[str] = ..., stream: _Optional[str] = ..., group: _Optional[str] = ..., payload: _Optional[_Mapping[str, bytes]] = ..., attempts: _Optional[int] = ..., minted_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., traceparent: _Optional[str] = ..., raw_fields: _Optional[_Iterable[_Union[_types_pb2.RawField, _Mapping]]] = ...) -> None: ...

class VerdictError(_message.Message):
    __slots__ = ("id", "code", "message")
    ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: str
    code: VerdictErrorCode
    message: str
    def __init__(self, id: _Optional[str] = ..., code: _Optional[_Union[VerdictErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...
