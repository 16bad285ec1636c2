/**
 * `@echomq/client`: the TypeScript client of the EchoMQ sidecar.
 *
 * Layout:
 * - `consumer.ts`: {@link Consumer}, the Consume call: subscribe, batched
 *   frames, a handler per delivery (or per batch) on a fixed set of workers or
 *   a `for await` loop, coalesced acks, verdicts, LEASE_LOST, reconnect,
 *   graceful stop;
 * - `delivery.ts`: the {@link Delivery} a handler receives and settles;
 * - `producer.ts`: {@link Streams}: Append, AppendBatch (with dedup keys:
 *   {@link BatchEntry}), Read (and paging over it) and Trim; `Producer` is its
 *   deprecated old name;
 * - `admin.ts`: {@link Admin}: DescribeGroup, dead letters listed and replayed;
 * - `entry.ts`: the {@link Entry} that reads return;
 * - `branded-id.ts`: the {@link BrandedId} type and helpers;
 * - `idempotency.ts`: {@link SeenSet} and {@link NewerWins}, deduplication by branded id;
 * - `errors.ts`: {@link EchoMQError} and which gRPC codes are permanent, and
 *   {@link TransientError} / {@link PoisonError}, which a handler throws to fail
 *   a delivery with that kind;
 * - `grpc.ts`: proto loading and channel defaults;
 * - `gen/`: types generated from `proto/` at build time (never committed).
 *
 * @module
 */
export {
  Consumer,
  DEFAULT_ACK_BATCH,
  DEFAULT_ACK_LINGER_MS,
  DEFAULT_CONCURRENCY,
  DEFAULT_MAX_BATCH,
  DEFAULT_MAX_IN_FLIGHT,
  type BatchHandler,
  type BatchVerdicts,
  type ConsumerOptions,
  type FlowControl,
  type Start,
  /** @deprecated Use `Start`. */
  type GroupStart,
  type Handler,
  type ReconnectInfo,
  type RunOptions,
  type StopOptions,
  type Subscribed,
  type Verdict,
  type VerdictError,
} from './consumer.js';
export type { Delivery, Emit, EmittedEntry, FailKind, FailOptions } from './delivery.js';
export type { FieldValue, Fields, RawField } from './fields.js';
export {
  Producer,
  Streams,
  type AppendBatchOptions,
  type AppendOptions,
  type AppendResult,
  type BatchEntry,
  type ListScheduledOptions,
  type ReadAllOptions,
  type ReadBound,
  type ReadPage,
  type ReadRange,
  type Schedule,
  type ScheduledEntry,
  type ScheduledPage,
  type TrimBound,
  type TrimOptions,
  type TrimResult,
} from './producer.js';
export type { Entry } from './entry.js';
export {
  Admin,
  type BusyKey,
  type ConsumerInfo,
  type DeadLetter,
  type DeadLetterPage,
  type GroupInfo,
  type ListDeadLettersOptions,
  type ReplayOptions,
  type ReplayResult,
} from './admin.js';
export {
  brandedIdFromStreamId,
  brandedIdTime,
  brandedIdToStreamId,
  compareBrandedIds,
  isBrandedId,
  parseBrandedId,
  type BrandedId,
} from './branded-id.js';
export {
  MemorySeenStore,
  MemoryVersionStore,
  NewerWins,
  SeenSet,
  type SeenStore,
  type VersionStore,
  /** @deprecated Use `MemoryVersionStore`. */
  MemoryNewerWinsStore,
  /** @deprecated Use `VersionStore`. */
  type NewerWinsStore,
} from './idempotency.js';
export {
  AckEmitError,
  CallEndedError,
  EchoMQError,
  LeaseLostError,
  NotScheduledError,
  PERMANENT_CODES,
  PoisonError,
  TransientError,
  type VerdictErrorCode,
} from './errors.js';
export { DEFAULT_TARGET, type CallOptions, type ConnectionOptions } from './grpc.js';
