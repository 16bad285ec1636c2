"""EchoMQ: Redis Streams consumer groups through the EchoMQ sidecar.

Layout:

- `consumer`: `Consumer`, the asyncio consumer (one Consume call, batched
  frames, coalesced acks, a bounded pool of handler workers, an opt-in batch
  handler, graceful stop, reconnect with jittered backoff);
- `delivery`: `Delivery` (what a handler gets, with ack/fail/dead_letter),
  `Ack`/`Fail`/`DeadLetter` (a batch handler's verdicts) and `VerdictError`
  (a verdict the sidecar did not apply);
- `producer`: `Producer`, Append and AppendBatch;
- `options`: `Start` (where a new group starts) and `Backoff`;
- `idempotency`: `SeenSet` and `NewerWins`, keyed by the branded id;
- `errors`: `EchoMQError`, `RpcError`, `PermanentError`;
- `sync`: blocking `Producer` and `Consumer` for scripts;
- `v1`: the generated protobuf/gRPC stubs (do not edit).
"""

from .consumer import BatchHandler, Consumer, Handler, Subscription
from .delivery import Ack, DeadLetter, Delivery, Fail, RawField, Verdict, VerdictError, VerdictErrorCode
from .errors import EchoMQError, PermanentError, RpcError
from .idempotency import MemorySeenStore, MemoryVersionStore, NewerWins, SeenSet, SeenStore, VersionStore, is_branded_id
from .options import Backoff, Start, StartKind
from .producer import Appended, Producer

__all__ = [
    "Ack",
    "Appended",
    "Backoff",
    "BatchHandler",
    "Consumer",
    "DeadLetter",
    "Delivery",
    "EchoMQError",
    "Fail",
    "Handler",
    "MemorySeenStore",
    "MemoryVersionStore",
    "NewerWins",
    "PermanentError",
    "RawField",
    "RpcError",
    "SeenSet",
    "SeenStore",
    "Start",
    "StartKind",
    "Subscription",
    "Verdict",
    "VerdictError",
    "VerdictErrorCode",
    "VersionStore",
    "is_branded_id",
]
__version__ = "0.1.0"
