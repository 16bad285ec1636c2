"""The old home of appends, kept for a release: `Producer` is now
`echomq.Streams` and `Appended` is `echomq.AppendResult` (both warn when
used); what appends send and answer lives in `echomq._appends`."""

from __future__ import annotations

from . import streams
from ._appends import (
    AppendResult,
    BatchEntry,
    Fields,
    append_batch_request,
    append_request,
    appended,
    batch_entry,
    encode_fields,
)
from ._deprecation import renamed_attributes

__all__ = [
    "AppendResult",
    "BatchEntry",
    "Fields",
    "append_batch_request",
    "append_request",
    "appended",
    "batch_entry",
    "encode_fields",
]

#: Old names: `Producer` (now `echomq.Streams`) and `Appended`.
__getattr__ = renamed_attributes(
    "echomq.producer",
    {
        "Producer": ("echomq.Streams", lambda: streams.Producer),
        "Appended": ("echomq.AppendResult", lambda: AppendResult),
    },
)
