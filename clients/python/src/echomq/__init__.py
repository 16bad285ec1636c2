"""EchoMQ: Redis Streams consumer groups through the EchoMQ sidecar.

Layout:

- `consumer`: `Consumer`, the asyncio consumer (one Consume call, batched
  frames, coalesced acks, a bounded pool of handler workers, an opt-in batch
  handler or `async for` iteration, LEASE_LOST signalled to the delivery,
  graceful stop, reconnect with jittered backoff);
- `delivery`: `Delivery` (what a handler gets, with ack/fail/dead_letter and
  ack_emit: consume → produce exactly once, `Emit`, `EmittedEntry`,
  `AckEmitError`),
  `Ack`/`Fail`/`DeadLetter` (a batch handler's verdicts), `FailKind` (whose
  fault a failure was) and `VerdictError` (a verdict the sidecar did not apply);
- `streams`: `Streams`, the StreamService: append and append a batch, read (by
  id or instant, paged) and trim (safe by default); `Producer` is its
  deprecated name;
- `_appends`: what appends send and answer (`AppendResult`, `BatchEntry`: a
  batch entry with a dedup key); `producer` is its old home, kept for a
  release;
- `admin`: `Admin`, describe a group, list and replay dead letters;
- `records`: what Read, Trim and the AdminService answer (`Entry`, `ReadPage`,
  `TrimResult`, `GroupInfo`, `DeadLetterEntry`, `ReplayResult`, …);
- `_convert`: the wire ↔ Python conversions behind `streams` and `admin`;
- `options`: `Start` (where a new group starts), `FlowControl` (max_in_flight,
  concurrency, max_batch) and `Backoff`;
- `idempotency`: `SeenSet` and `NewerWins`, keyed by the branded id;
- `errors`: `EchoMQError`, `RpcError`, `PermanentError`, `PERMANENT_CODES`, and
  `TransientError` / `PoisonError`, which a handler raises to fail a delivery
  with that kind;
- `sync`: blocking `Streams`, `Admin` and `Consumer` for scripts, derived from
  the asyncio ones;
- `v1`: the generated protobuf/gRPC stubs (do not edit).
"""

from ._deprecation import renamed_attributes
from .admin import Admin
from .consumer import BatchHandler, Consumer, Handler, Subscription
from .delivery import (
    Ack,
    AckEmitError,
    DeadLetter,
    Delivery,
    Emit,
    EmittedEntry,
    Fail,
    FailKind,
    RawField,
    Verdict,
    VerdictError,
    VerdictErrorCode,
)
from .errors import (
    PERMANENT_CODES,
    EchoMQError,
    NotScheduledError,
    PermanentError,
    PoisonError,
    RpcError,
    TransientError,
)
from .idempotency import MemorySeenStore, MemoryVersionStore, NewerWins, SeenSet, SeenStore, VersionStore, is_branded_id
from .options import Backoff, FlowControl, Start, StartKind
from ._appends import AppendResult, BatchEntry
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
from .streams import Producer, Streams

__all__ = [
    "PERMANENT_CODES",
    "Ack",
    "AckEmitError",
    "Admin",
    "AppendResult",
    "Backoff",
    "BatchEntry",
    "BatchHandler",
    "BusyKey",
    "Consumer",
    "ConsumerInfo",
    "DeadLetter",
    "DeadLetterEntry",
    "DeadLetterPage",
    "Delivery",
    "EchoMQError",
    "Emit",
    "EmittedEntry",
    "Entry",
    "Fail",
    "FailKind",
    "FlowControl",
    "GroupInfo",
    "Handler",
    "MemorySeenStore",
    "MemoryVersionStore",
    "NewerWins",
    "NotScheduledError",
    "PermanentError",
    "PoisonError",
    "RawField",
    "ReadPage",
    "Replayed",
    "ReplayResult",
    "RpcError",
    "ScheduledEntry",
    "ScheduledPage",
    "SeenSet",
    "SeenStore",
    "Start",
    "StartKind",
    "Streams",
    "Subscription",
    "TransientError",
    "TrimResult",
    "Verdict",
    "VerdictError",
    "VerdictErrorCode",
    "VersionStore",
    "is_branded_id",
]
__version__ = "0.1.0"

#: Renamed for one name in every client (clients/CONTRACT.md, "Surface"); the
#: old names warn `DeprecationWarning` when read and go away in the next release.
__getattr__ = renamed_attributes(
    "echomq", {"Appended": ("echomq.AppendResult", lambda: AppendResult), "Trimmed": ("echomq.TrimResult", lambda: TrimResult)}
)
